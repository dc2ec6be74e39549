"""Event waits: a step waits for a named event, optionally correlated. Pure.

An event wait is a boundary of kind ``event`` (``AwaitSpec.kind``): its step's function
returns the wait's correlation (a JSON object of string fields, ``{}`` for none); the run
suspends with one interaction whose target is the wait's **registration**: the event
name, the correlation and the correlation field that keys it in the correlation index
(if any), as canonical JSON. Nothing goes to boundary.requests. The interaction keeps its
deadline (acceptance + timeout), its timer and its fencing like any await's, so a
timeout, a cancel, a lane of a graph and ``status`` need nothing new.

An event (``SignalEvent``) settles the oldest open wait of its run with its name whose
correlation it satisfies: every field the wait declares is in the event's correlation
with the same value (a subset match; the event may carry more). The registration rule
(docs/design/signals.md): an event settles only a wait registered before the event is
admitted, in the order of the run's partition; an event that finds no open matching wait
is refused (``no_matching_wait``), never buffered. The same event id twice is admitted
once: the admitted interaction keeps the digest of the event's name and id.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from processor.model.pipeline_spec import AwaitSpec
from processor.model.state import Interaction, RunState

__all__ = [
    "EVENT",
    "Registration",
    "correlation_problem",
    "event_digest",
    "find_admitted",
    "find_open",
    "keyed",
    "listed_target",
    "matches",
    "parse_registration",
    "registration_target",
    "shown",
    "suspension_problem",
    "target_of",
]

#: The boundary kind of an event wait.
EVENT = "event"


@dataclass(frozen=True, slots=True)
class Registration:
    """What an event wait waits for: the event name, its correlation, its index key field."""

    event: str
    correlation: Mapping[str, str]
    key_field: str | None = None

    @property
    def key(self) -> str | None:
        """The correlation key the wait registers under in the index (None: by run only)."""
        value = None if self.key_field is None else self.correlation.get(self.key_field)
        return value if isinstance(value, str) else None


def registration_target(event: str, correlation: Mapping[str, str], key_field: str | None) -> str:
    """The interaction target of a wait: its registration as canonical JSON."""
    body = {"event": event, "correlation": dict(correlation), "key": key_field}
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def parse_registration(target: str) -> Registration | None:
    """The registration an event interaction's target holds (None: not one)."""
    if not target.startswith("{"):
        return None
    try:
        body = json.loads(target)
    except ValueError:
        return None
    if not isinstance(body, dict) or not isinstance(body.get("event"), str):
        return None
    correlation = body.get("correlation")
    if not isinstance(correlation, dict):
        return None
    key_field = body.get("key")
    return Registration(
        body["event"], correlation, key_field if isinstance(key_field, str) else None
    )


def correlation_problem(request: bytes, key_field: str | None) -> str:
    """What is wrong with a wait's correlation as its step returned it ('' if nothing)."""
    try:
        value = json.loads(request)
    except ValueError:
        return "the correlation is not JSON"
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        return f"an event wait's correlation is an object of strings, got {value!r}"
    if key_field is not None and key_field not in value:
        return f"the correlation has no field {key_field!r}, the wait's key"
    return ""


def matches(wanted: Mapping[str, str], carried: Mapping[str, str]) -> bool:
    """Whether an event carrying ``carried`` satisfies a wait declaring ``wanted``."""
    return all(carried.get(field) == value for field, value in wanted.items())


def event_digest(event: str, event_id: str) -> bytes:
    """The identity of an event: its name and id (a resend with any payload is the same)."""
    digest = hashlib.sha256(b"event")
    for part in (event.encode(), event_id.encode()):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.digest()


def _event_waits(state: RunState, event: str) -> Iterable[tuple[str, Interaction, Registration]]:
    for key, interaction in state.interactions.items():
        if interaction.kind != EVENT:
            continue
        registration = parse_registration(interaction.target)
        if registration is not None and registration.event == event:
            yield key, interaction, registration


def find_admitted(state: RunState, event: str, digest: bytes) -> tuple[str, Interaction] | None:
    """The wait an event with this identity was admitted to, if any (a duplicate)."""
    for key, interaction, _ in _event_waits(state, event):
        if interaction.status == "admitted" and interaction.digest == digest:
            return key, interaction
    return None


def find_open(
    state: RunState,
    event: str,
    carried: Mapping[str, str],
    interaction: str | None = None,
    key: str | None = None,
) -> tuple[str, Interaction] | None:
    """The open wait an event settles: the oldest (lowest boundary) one with its name whose
    correlation it satisfies; ``interaction``: only that one. An event by correlation
    ``key`` settles only waits keyed by it, and carries their key field by its key."""
    found = [
        (name, i)
        for name, i, registration in _event_waits(state, event)
        if i.status == "open"
        and _satisfies(registration, carried, key)
        and (interaction is None or name == interaction)
    ]
    return min(found, key=lambda c: (c[1].boundary, c[0])) if found else None


def _satisfies(registration: Registration, carried: Mapping[str, str], key: str | None) -> bool:
    if key is None:
        return matches(registration.correlation, carried)
    if registration.key_field is None or registration.key != key:
        return False
    return matches(registration.correlation, {**carried, registration.key_field: key})


def target_of(awaits: AwaitSpec, request: bytes) -> str:
    """An interaction's target: the await's, or an event wait's registration."""
    if awaits.kind != EVENT:
        return awaits.target
    return registration_target(awaits.target, json.loads(request), awaits.event_key)


def suspension_problem(requests: Sequence[bytes], key_field: str | None) -> str:
    """What is wrong with an event wait's suspended result ('' if nothing)."""
    if len(requests) != 1:
        return f"an event wait sends one correlation, got {len(requests)}"
    return correlation_problem(requests[0], key_field)


def shown(interactions: Iterable[Interaction]) -> dict[str, Any]:
    """What ``status`` shows of a boundary's event wait: the event it waits for, its
    correlation, its index key and its deadline ({} for any other boundary)."""
    for interaction in interactions:
        registration = parse_registration(interaction.target)
        if interaction.kind == EVENT and registration is not None:
            return {
                "event": {
                    "name": registration.event,
                    "correlation": dict(registration.correlation),
                    "key": registration.key,
                    "deadline_ms": interaction.deadline_ms,
                    "status": interaction.status,
                }
            }
    return {}


def keyed(targets: Iterable[str]) -> set[tuple[str, str]]:
    """The (event name, correlation key) of each open wait target that has a key: the runs
    index finds a waiting run by them when an event comes by correlation key."""
    found = set()
    for target in targets:
        registration = parse_registration(target)
        if registration is not None and registration.key is not None:
            found.add((registration.event, registration.key))
    return found


def listed_target(target: str) -> str:
    """How the runs index and the metrics name what a run waits on: an event wait as
    ``event:<name>``, any other target as it is."""
    registration = parse_registration(target)
    return target if registration is None else f"event:{registration.event}"
