"""The schedule routes of the JSON API: create, list, show, pause, resume, delete.

Each goes through ``Client.schedules`` (``processor/clients/schedules.py``): a
malformed schedule (bad cron, unknown time zone, bad policy) is refused before
anything is produced, 422; an unknown pipeline is refused by the processor, 422; an
unknown schedule 404. A schedule's input is shown with resume tokens redacted
without the bearer token, as a run's is.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from processor.clients.schedules import ScheduleError, ScheduleReceipt
from processor.web.context import WebContext
from processor.web.errors import ApiError
from processor.web.models import ErrorBody
from processor.web.reads import shown_to

__all__ = ["ScheduleBody", "schedule_routes"]

#: How long a schedule command waits for the processor's answer (then 202: queued).
SCHEDULE_WAIT_S = 10.0
_REFUSAL_STATUS = {"unknown_schedule": 404, "schedule_exists": 409}


class ScheduleBody(BaseModel):
    """A schedule to create: a cron expression (in ``timezone``) or ``interval_s``."""

    model_config = ConfigDict(extra="forbid")

    schedule_id: str = Field(description="Letters, digits, '.', '_' or '-'")
    pipeline: str
    input: Any = None
    cron: str | None = None
    interval_s: float | None = None
    timezone: str = "UTC"
    catch_up: str = Field("skip", description="skip, last or all")
    catch_up_limit: int = 10
    overlap: str = Field("allow", description="skip, queue or allow")
    jitter_s: float = 0.0


def schedule_routes(router: APIRouter, context: WebContext, reader: Any, writer: Any) -> None:
    errors: dict[int | str, dict[str, Any]] = {
        404: {"model": ErrorBody},
        409: {"model": ErrorBody},
        422: {"model": ErrorBody},
    }

    @router.post(
        "/schedules",
        summary="Create a schedule (201 created, 200 the same again, 202 queued)",
        status_code=201,
        responses=errors,
        dependencies=[writer],
    )
    def create(body: ScheduleBody, response: Response) -> dict[str, Any]:
        with context.client() as client:
            try:
                receipt = client.schedules.create(
                    body.schedule_id,
                    body.pipeline,
                    body.input,
                    cron=body.cron,
                    interval_s=body.interval_s,
                    timezone=body.timezone,
                    catch_up=body.catch_up,
                    catch_up_limit=body.catch_up_limit,
                    overlap=body.overlap,
                    jitter_s=body.jitter_s,
                    wait_s=SCHEDULE_WAIT_S,
                )
            except ScheduleError as exc:
                raise ApiError(422, exc.reason, exc.detail) from None
        return _answer(receipt, response)

    @router.get("/schedules", summary="Every schedule", dependencies=[reader])
    def listing(request: Request) -> list[dict[str, Any]]:
        with context.client() as client:
            listed = client.schedules.list()
        shown: list[dict[str, Any]] = shown_to(context, request)(listed)
        return shown

    @router.get(
        "/schedules/{schedule_id}",
        summary="One schedule: next fire, last fire and run, paused",
        responses={404: {"model": ErrorBody}},
        dependencies=[reader],
    )
    def show(schedule_id: str, request: Request) -> dict[str, Any]:
        with context.client() as client:
            found = client.schedules.get(schedule_id)
        if found is None:
            raise ApiError(404, "unknown_schedule", f"no schedule named {schedule_id!r}")
        shown: dict[str, Any] = shown_to(context, request)(found)
        return shown

    for action in ("pause", "resume", "delete"):
        _action_route(router, context, writer, action, errors)


def _action_route(
    router: APIRouter,
    context: WebContext,
    writer: Any,
    action: str,
    errors: dict[int | str, dict[str, Any]],
) -> None:
    @router.post(
        f"/schedules/{{schedule_id}}/{action}",
        summary=f"{action.capitalize()} a schedule (200; 202 queued)",
        responses=errors,
        dependencies=[writer],
        name=f"schedule_{action}",
    )
    def act(schedule_id: str, response: Response) -> dict[str, Any]:
        with context.client() as client:
            try:
                receipt = getattr(client.schedules, action)(schedule_id, wait_s=SCHEDULE_WAIT_S)
            except ScheduleError as exc:
                raise ApiError(422, exc.reason, exc.detail) from None
        answer = _answer(receipt, response)
        response.status_code = 202 if receipt.changed is None else 200
        return answer


def _answer(receipt: ScheduleReceipt, response: Response) -> dict[str, Any]:
    if receipt.refusal:
        status = _REFUSAL_STATUS.get(receipt.refusal, 422)
        raise ApiError(status, receipt.refusal, receipt.detail or receipt.refusal)
    response.status_code = {True: 201, False: 200, None: 202}[receipt.changed]
    return receipt.as_dict()
