"""The HTTP app: health, metrics, the JSON API and the inspector page.

``create_app(context)`` builds it for a running processor (every route) or, when
``context.deployment`` is None, for a worker (/healthz, /readyz, /metrics). The
routes and their shapes are in README.md, "HTTP API and metrics"; the OpenAPI
document is at /openapi.json, its pages at /docs.
"""

from __future__ import annotations

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from processor.telemetry.metrics import REGISTRY
from processor.web.api import api_router
from processor.web.context import WebContext
from processor.web.errors import ApiError, install_error_handlers
from processor.web.models import ErrorBody, Health, Ready

__all__ = ["create_app"]


def create_app(context: WebContext) -> FastAPI:
    """The FastAPI app of one process (see the module doc)."""
    app = FastAPI(
        title="processor",
        summary="Durable, event-sourced pipelines on Kafka: runs, their history, "
        "pending requests, rejected input and dead letters",
        responses={401: {"model": ErrorBody}, 422: {"model": ErrorBody}},
    )
    install_error_handlers(app)
    app.include_router(_health_router(context))
    if context.deployment is not None:
        app.include_router(api_router(context), prefix="/api")
        app.include_router(_page_router(context))
        if context.static_dir.is_dir():
            app.mount("/static", StaticFiles(directory=context.static_dir), name="static")
    return app


def _health_router(context: WebContext) -> APIRouter:
    router = APIRouter(tags=["health"])

    @router.get("/healthz", summary="Alive", response_model=Health)
    def healthz() -> Health:
        return Health(status="ok")

    @router.get(
        "/readyz",
        summary="Partitions assigned and caught up (503 while restoring a store)",
        response_model=Ready,
        responses={503: {"model": Ready}},
    )
    def readyz() -> JSONResponse:
        state = context.readiness()
        if state.ready:
            return JSONResponse({"ready": True, "partitions": state.partitions})
        return JSONResponse({"ready": False, "reason": state.reason}, 503)

    @router.get("/metrics", summary="Prometheus metrics (text format)", response_class=Response)
    def metrics() -> Response:
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    return router


def _page_router(context: WebContext) -> APIRouter:
    router = APIRouter(tags=["page"])

    @router.get("/", summary="The run inspector page", response_class=FileResponse)
    def page() -> FileResponse:
        index = context.static_dir / "index.html"
        if not index.is_file():
            raise ApiError(404, "no_page", "the inspector page is not installed here")
        return FileResponse(index, media_type="text/html")

    return router
