"""Events for event waits: decoding a ``SignalEvent`` into an Arrival, and what an event
finds in its run (model/event_waits.py; docs/design/signals.md).

After decoding, an event is admitted by the one admission stage (``admit.py``) like a
completion: it settles the oldest open wait of its run with its name and a correlation it
satisfies; the same event id again is a no-op; an event for a finished run or one that
matches no open wait is refused with a reason and kept in admission.rejected.
"""

from __future__ import annotations

from dataclasses import dataclass

from processor.admission.arrivals import JSON, Arrival, Refusal, canonical_payload
from processor.facts import json_wire
from processor.facts.codec import codec
from processor.facts.json_wire import HeaderPairs
from processor.facts.models import SignalEvent
from processor.model import event_waits
from processor.model.state import Interaction, RunState

__all__ = [
    "NO_MATCHING_WAIT",
    "KeyedEvent",
    "event_arrival",
    "event_interaction",
    "event_refusal",
]

#: The reason an event is refused when no open wait takes it.
NO_MATCHING_WAIT = "no_matching_wait"


@dataclass(frozen=True, slots=True)
class KeyedEvent:
    """An event by correlation key: for every run waiting on its name and key."""

    event: SignalEvent
    payload: bytes  # canonical JSON
    cause_id: str

    @property
    def key(self) -> str:
        return self.event.correlation_key or ""

    def arrival(self, run_id: str) -> Arrival:
        """The event as it arrives at one run waiting on its key."""
        return _arrival(self.event, run_id, self.payload, self.cause_id, key=self.key)


def event_arrival(
    value: bytes | None, cause_id: str, headers: HeaderPairs = ()
) -> Arrival | KeyedEvent | Refusal:
    """Decode an event for one run, or by correlation key (raises FactDecodeError if
    undecodable). A record whose headers name the JSON shape (``json_wire``) is decoded
    from JSON, any other as Avro; both give the same SignalEvent."""
    if json_wire.is_json_event(headers):
        event = json_wire.decode_event(value)
    else:
        event = codec().decode_as(value, SignalEvent)
    if not event.event_id or not event.name:
        return Refusal("malformed", "an event needs an event_id and a name", event.run_id)
    if (event.run_id is None) == (event.correlation_key is None):
        detail = "an event names a run_id or a correlation_key, exactly one"
        return Refusal("malformed", detail, event.run_id)
    body = canonical_payload(event.payload, event.content_type, event.run_id or "")
    if isinstance(body, Refusal):
        return body
    if event.run_id is None:
        return KeyedEvent(event, body, cause_id)
    return _arrival(event, event.run_id, body, cause_id)


def _arrival(
    event: SignalEvent, run_id: str, body: bytes, cause_id: str, *, key: str | None = None
) -> Arrival:
    return Arrival(
        source="event",
        run_id=run_id,
        cause_id=cause_id,
        outcome="success",
        payload=body,
        content_type=JSON,
        error=None,
        idempotency_key=event.event_id,
        event=event.name,
        correlation=tuple(sorted(event.correlation.items())),
        settles=event.interaction,
        key=key,
    )


def event_interaction(arrival: Arrival, state: RunState) -> tuple[str, Interaction] | None:
    """The wait an event was admitted to before (a duplicate), or the one it settles now."""
    assert arrival.event is not None
    admitted = event_waits.find_admitted(state, arrival.event, arrival.digest)
    if admitted is not None:
        return admitted
    carried = dict(arrival.correlation)
    return event_waits.find_open(state, arrival.event, carried, arrival.settles, arrival.key)


def event_refusal(arrival: Arrival, state: RunState) -> tuple[str, str]:
    """Why an event found no wait: its run finished, or nothing waits for it (yet)."""
    if state.terminal:
        return "run_terminal", f"run {state.run_id} is already {state.status}"
    what = f"event {arrival.event!r} ({arrival.idempotency_key})"
    return NO_MATCHING_WAIT, f"{what}: run {state.run_id} has no open wait it matches"
