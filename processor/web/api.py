"""The JSON API under /api: runs, their history, submit, cancel, completions.

Writes go through the same paths as every other producer: a submit or a cancel is
a command on runs.commands (``Client``), a completion is produced to
boundary.completions (``Client.complete``) and the processor's admission stage
decides on it like on any external system's: a forged one ends in
admission.rejected.
"""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response

from processor.clients.client import Client, status_dict
from processor.facts import tokens
from processor.facts.models import CommandReply
from processor.store.listing import MAX_LIMIT, RunQuery, list_runs
from processor.web.auth import require_token, require_token_off_loopback
from processor.web.context import WebContext
from processor.web.errors import ApiError
from processor.web.models import (
    CancelBody,
    CommandAnswer,
    CompletionBody,
    ErrorBody,
    Queued,
    RunList,
    RunStatus,
    SubmitAnswer,
    SubmitBody,
)

__all__ = ["COMMAND_WAIT_S", "DEFAULT_LIMIT", "api_router"]

#: Items of a page when the request gives no ``limit``.
DEFAULT_LIMIT = 50

#: How long a submit or a cancel waits for the processor's reply before answering
#: "queued" (the command is durable in runs.commands by then).
COMMAND_WAIT_S = 10.0

# Refusals of a command that are about the run, not about the request.
_REFUSAL_STATUS = {"unknown_run": 404, "run_terminal": 409, "not_failed": 409}


def api_router(context: WebContext) -> APIRouter:
    """Every /api route, with the auth the README describes."""

    def reader(request: Request) -> None:
        require_token_off_loopback(context, request)

    def writer(request: Request) -> None:
        require_token(context, request)

    router = APIRouter(tags=["api"], responses={401: {"model": ErrorBody}})
    _run_routes(router, context, Depends(reader))
    _command_routes(router, context, Depends(writer))
    return router


def _client(context: WebContext) -> AbstractContextManager[Client]:
    assert context.clients is not None
    return context.clients.client()


def _run_routes(router: APIRouter, context: WebContext, reader: Any) -> None:
    @router.get(
        "/runs",
        summary="List runs, newest submitted first, by status, pipeline, time and target",
        response_model=RunList,
        responses={400: {"model": ErrorBody}},
        dependencies=[reader],
    )
    def runs(
        *,
        status: Annotated[str | None, Query(description="running, succeeded, ...")] = None,
        pipeline: str | None = None,
        since: Annotated[int | None, Query(ge=0, description="Submitted at or after (ms)")] = None,
        until: Annotated[int | None, Query(ge=0, description="Submitted before (epoch ms)")] = None,
        target: Annotated[str | None, Query(description="Waiting at a boundary on it")] = None,
        cursor: Annotated[str | None, Query(description="next_cursor of a page")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
    ) -> RunList:
        query = RunQuery(status, pipeline, since, until, target)
        assert context.stores is not None
        try:
            with context.stores.fresh() as stores:
                page = list_runs(stores, query, cursor, limit)
        except ValueError as exc:
            raise _bad_query(str(exc)) from exc
        return RunList(runs=[run.as_dict() for run in page.runs], next_cursor=page.next_cursor)

    @router.get(
        "/runs/{run_id}",
        summary="One run's status (as of the end of runs.facts)",
        response_model=RunStatus,
        responses={404: {"model": ErrorBody}},
        dependencies=[reader],
    )
    def run_status(run_id: str) -> dict[str, Any]:
        with _client(context) as client:
            state = client.current(run_id).state
        if state is None:
            raise ApiError(404, "unknown_run", f"no run {run_id}")
        return status_dict(state)


def _command_routes(router: APIRouter, context: WebContext, writer: Any) -> None:
    @router.post(
        "/runs",
        summary="Submit a run (201 created, 200 existing; 202 queued without an answer)",
        status_code=201,
        response_model=SubmitAnswer,
        responses={200: {"model": SubmitAnswer}, 202: {"model": SubmitAnswer}},
        dependencies=[writer],
    )
    def submit(body: SubmitBody, response: Response) -> dict[str, Any]:
        with _client(context) as client:
            receipt = client.submit(
                body.pipeline,
                body.input,
                body.idempotency_key,
                deadline_s=body.deadline_s,
                wait_s=COMMAND_WAIT_S,
            )
        if receipt.refusal:
            raise ApiError(422, receipt.refusal, receipt.detail or receipt.refusal)
        response.status_code = {True: 201, False: 200, None: 202}[receipt.created]
        return receipt.as_dict()

    @router.post(
        "/runs/{run_id}/cancel",
        summary="Cancel a run (stop intent; the running attempt settles, steps are compensated)",
        status_code=202,
        response_model=CommandAnswer,
        responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}},
        dependencies=[writer],
    )
    def cancel(run_id: str, body: CancelBody | None = None) -> dict[str, Any]:
        reason = body.reason if body is not None else ""
        with _client(context) as client:
            reply = client.cancel(run_id, reason, wait_s=COMMAND_WAIT_S)
        return command_answer(run_id, reply)

    @router.post(
        "/completions",
        summary="Complete an await: produced to boundary.completions, admitted like any other",
        status_code=202,
        response_model=Queued,
        dependencies=[writer],
    )
    def complete(body: CompletionBody) -> Queued:
        if tokens.parse(body.token) is None:
            raise ApiError(422, "invalid_token", "not a resume token")
        with _client(context) as client:
            _send_completion(client, body)
        return Queued(queued=True)


def _bad_query(message: str) -> ApiError:
    """A refused query: a bad cursor, or a filter the listing does not know."""
    return ApiError(400, "bad_cursor" if "cursor" in message else "bad_query", message)


def _send_completion(client: Client, body: CompletionBody) -> None:
    if body.outcome == "failed":
        if not body.error:
            raise ApiError(422, "invalid_request", "error: required when the outcome is failed")
        client.fail(body.token, body.error, body.idempotency_key)
        return
    if body.error is not None:
        raise ApiError(422, "invalid_request", "error: only when the outcome is failed")
    client.complete(body.token, body.output, body.idempotency_key)


def command_answer(run_id: str, reply: CommandReply | None) -> dict[str, Any]:
    """A command's reply as the API answers it (a refusal as an error)."""
    if reply is None:
        return {"run_id": run_id, "accepted": None, "queued": True}
    if reply.refusal:
        status = _REFUSAL_STATUS.get(reply.refusal, 409)
        raise ApiError(status, reply.refusal, reply.detail or reply.refusal)
    response: dict[str, Any] = json.loads(reply.response) if reply.response else {}
    return {"run_id": reply.run_id, "accepted": reply.created, "detail": reply.detail, **response}
