"""The write routes of the JSON API: submit, cancel, redrive, release, completions.

Writes go through the same paths as every other producer: a submit, a cancel, a
redrive or a release is a command on runs.commands (``Client``); a completion is produced to
boundary.completions (``Client.complete``) and the processor's admission stage
decides on it like on any external system's: a forged one ends in
admission.rejected. With ``wait_s`` the answer says what admission decided.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Response

from processor.clients.client import Client, CompletionReceipt, check_traceparent
from processor.facts import payload, tokens
from processor.facts.models import CommandReply
from processor.web.context import WebContext
from processor.web.errors import ApiError
from processor.web.models import (
    CancelBody,
    CommandAnswer,
    CompletionAnswer,
    CompletionBody,
    ErrorBody,
    RedriveBody,
    ReleaseBody,
    SubmitAnswer,
    SubmitBody,
)

__all__ = ["COMMAND_WAIT_S", "COMPLETION_WAIT_MAX_S", "command_answer", "command_routes"]

#: How long a submit or a cancel waits for the processor's reply before answering
#: "queued" (the command is durable in runs.commands by then).
COMMAND_WAIT_S = 10.0

# Refusals of a command that are about the request or the run's existence; the others
# (not_failed, run_terminal, ...) are about the run's state: 409.
_REFUSAL_STATUS = {"unknown_run": 404, "bad_step": 422}
#: A run input or completion over the payload limit (refused by the client or the processor).
TOO_LARGE = "payload_too_large"
#: The longest a completion may wait for its admission decision.
COMPLETION_WAIT_MAX_S = 60.0
# Refusals of a completion that are about the completion itself; the others
# (conflicting_completion, late_completion, run_terminal, ...) are about the run: 409.
_COMPLETION_REFUSAL_STATUS = {
    TOO_LARGE: 413,
    "invalid_token": 422,
    "unknown_interaction": 422,
    "malformed": 422,
}


def command_routes(router: APIRouter, context: WebContext, writer: Any) -> None:
    @router.post(
        "/runs",
        summary="Submit a run (201 created, 200 existing; 202 queued without an answer)",
        status_code=201,
        response_model=SubmitAnswer,
        responses={
            200: {"model": SubmitAnswer},
            202: {"model": SubmitAnswer},
            413: {"model": ErrorBody},
        },
        dependencies=[writer],
    )
    def submit(
        body: SubmitBody,
        response: Response,
        traceparent: Annotated[str | None, Header(description="W3C trace context")] = None,
    ) -> dict[str, Any]:
        try:
            check_traceparent(traceparent)
        except ValueError as exc:
            raise ApiError(422, "invalid_traceparent", str(exc)) from None
        with context.client() as client, _payload_limit():
            receipt = client.submit(
                body.pipeline,
                body.input,
                body.idempotency_key,
                deadline_s=body.deadline_s,
                wait_s=COMMAND_WAIT_S,
                traceparent=traceparent,
            )
        if receipt.refusal:
            status = 413 if receipt.refusal == TOO_LARGE else 422
            raise ApiError(status, receipt.refusal, receipt.detail or receipt.refusal)
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
        with context.client() as client:
            reply = client.cancel(run_id, reason, wait_s=COMMAND_WAIT_S)
        return command_answer(run_id, reply)

    @router.post(
        "/runs/{run_id}/redrive",
        summary="Re-drive a failed run: a new attempt of its failed segment (or from_step)",
        status_code=202,
        response_model=CommandAnswer,
        responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}},
        dependencies=[writer],
    )
    def redrive(run_id: str, body: RedriveBody | None = None) -> dict[str, Any]:
        from_step = body.from_step if body is not None else None
        with context.client() as client:
            reply = client.redrive(run_id, from_step, operator="http", wait_s=COMMAND_WAIT_S)
        return command_answer(run_id, reply)

    @router.post(
        "/runs/{run_id}/release",
        summary="Release a quarantined run (a decision about it raised): its timers fire again",
        status_code=202,
        response_model=CommandAnswer,
        responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}},
        dependencies=[writer],
    )
    def release(run_id: str, body: ReleaseBody | None = None) -> dict[str, Any]:
        reason = body.reason if body is not None else ""
        with context.client() as client:
            reply = client.release(run_id, operator="http", reason=reason, wait_s=COMMAND_WAIT_S)
        return command_answer(run_id, reply)

    @router.post(
        "/completions",
        summary="Complete an await (admitted like any other); with wait_s, say what became of it",
        status_code=202,
        response_model=CompletionAnswer,
        responses={
            200: {"model": CompletionAnswer},
            409: {"model": ErrorBody},
            413: {"model": ErrorBody},
        },
        dependencies=[writer],
    )
    def complete(
        body: CompletionBody,
        response: Response,
        wait_s: Annotated[
            float,
            Query(
                ge=0,
                le=COMPLETION_WAIT_MAX_S,
                description="Seconds to wait for the admission decision (0: answer queued)",
            ),
        ] = 0.0,
    ) -> dict[str, Any]:
        if tokens.parse(body.token) is None:
            raise ApiError(422, "invalid_token", "not a resume token")
        with context.client() as client, _payload_limit():
            receipt = _send_completion(client, body, wait_s)
        if receipt.refusal is not None:
            status = _COMPLETION_REFUSAL_STATUS.get(receipt.refusal, 409)
            raise ApiError(status, receipt.refusal, receipt.detail or receipt.refusal)
        response.status_code = 202 if receipt.queued else 200
        return receipt.as_dict()


@contextmanager
def _payload_limit() -> Iterator[None]:
    """A payload the client refused before producing it: 413 with the sizes."""
    try:
        yield
    except payload.PayloadTooLarge as exc:
        raise ApiError(413, TOO_LARGE, str(exc)) from None


def _send_completion(client: Client, body: CompletionBody, wait_s: float) -> CompletionReceipt:
    if body.outcome == "failed":
        if not body.error:
            raise ApiError(422, "invalid_request", "error: required when the outcome is failed")
        return client.fail(body.token, body.error, body.idempotency_key, wait_s=wait_s)
    if body.error is not None:
        raise ApiError(422, "invalid_request", "error: only when the outcome is failed")
    return client.complete(body.token, body.output, body.idempotency_key, wait_s=wait_s)


def command_answer(run_id: str, reply: CommandReply | None) -> dict[str, Any]:
    """A command's reply as the API answers it (a refusal as an error)."""
    if reply is None:
        return {"run_id": run_id, "accepted": None, "queued": True}
    if reply.refusal:
        status = _REFUSAL_STATUS.get(reply.refusal, 409)
        raise ApiError(status, reply.refusal, reply.detail or reply.refusal)
    response: dict[str, Any] = json.loads(reply.response) if reply.response else {}
    return {"run_id": reply.run_id, "accepted": reply.created, "detail": reply.detail, **response}
