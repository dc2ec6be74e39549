"""The JSON API under /api, with the auth the README describes (``auth.py``):
the read routes (``reads.py``) and the write routes (``commands.py``)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from processor.web.auth import require_token, require_token_off_loopback
from processor.web.commands import command_routes
from processor.web.context import WebContext
from processor.web.models import ErrorBody
from processor.web.reads import read_routes, request_routes
from processor.web.run_graph import graph_routes
from processor.web.schedules import schedule_routes
from processor.web.signals import signal_routes

__all__ = ["api_router"]


def api_router(context: WebContext) -> APIRouter:
    """Every /api route: reads open on loopback, writes and tokens behind the bearer token."""

    def reader(request: Request) -> None:
        require_token_off_loopback(context, request)

    def writer(request: Request) -> None:
        require_token(context, request)

    router = APIRouter(tags=["api"], responses={401: {"model": ErrorBody}})
    read_routes(router, context, Depends(reader))
    graph_routes(router, context, Depends(reader))
    request_routes(router, context, Depends(writer))
    command_routes(router, context, Depends(writer))
    schedule_routes(router, context, Depends(reader), Depends(writer))
    signal_routes(router, context, Depends(writer))
    return router
