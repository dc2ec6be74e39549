"""The event route of the JSON API: POST /api/events sends a named event to a run or by
correlation key (``Client.signal``, docs/design/signals.md). The processor's admission
stage decides on it like on any other event; a refusal lands in admission.rejected."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, JsonValue

from processor.facts import payload
from processor.web.commands import TOO_LARGE
from processor.web.context import WebContext
from processor.web.errors import ApiError
from processor.web.models import ErrorBody

__all__ = ["EventAnswer", "EventBody", "signal_routes"]


class EventBody(BaseModel):
    """A named event for one run (``run_id``) or by correlation ``key``: exactly one."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description="The event name a wait names (await_event)")
    run_id: str | None = Field(default=None, min_length=1, description="The run it is for")
    key: str | None = Field(
        default=None, min_length=1, description="A correlation key: every run waiting on it"
    )
    correlation: dict[str, str] = Field(
        default_factory=dict, description="The event's correlation fields (string values)"
    )
    payload: JsonValue = Field(default=None, description="The next step's input")
    event_id: str | None = Field(
        default=None, min_length=1, description="The same id twice is admitted once"
    )


class EventAnswer(BaseModel):
    """An event as produced (admission decides later: see admission.rejected)."""

    model_config = ConfigDict(extra="allow")

    event_id: str
    name: str
    partition: int = Field(description="Where the event was written: its partition")
    offset: int = Field(description="... and its offset in boundary.events")


def signal_routes(router: APIRouter, context: WebContext, writer: Any) -> None:
    @router.post(
        "/events",
        summary="Send a named event to a run or by correlation key (202: produced)",
        status_code=202,
        response_model=EventAnswer,
        responses={413: {"model": ErrorBody}, 422: {"model": ErrorBody}},
        dependencies=[writer],
    )
    def send_event(body: EventBody) -> dict[str, Any]:
        if (body.run_id is None) == (body.key is None):
            raise ApiError(422, "invalid_request", "give exactly one of run_id and key")
        try:
            with context.client() as client:
                sent = client.signal(
                    body.name,
                    body.payload,
                    run_id=body.run_id,
                    key=body.key,
                    correlation=body.correlation,
                    event_id=body.event_id,
                )
        except payload.PayloadTooLarge as exc:
            raise ApiError(413, TOO_LARGE, str(exc)) from None
        except ValueError as exc:
            raise ApiError(422, "invalid_request", str(exc)) from None
        return sent.as_dict()
