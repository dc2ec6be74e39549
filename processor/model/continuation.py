"""The continuation planner: what a boundary does after an admission or a timeout.

Pure: from the run (with the new fact folded in) to one immutable plan.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from processor.facts import payload
from processor.model import waits
from processor.model.graph import Tolerance
from processor.model.state import Interaction, RunState

__all__ = [
    "TIMED_OUT",
    "FailParent",
    "Hold",
    "NoOp",
    "Plan",
    "RecordItem",
    "ReleaseItemized",
    "ReleaseScalar",
    "plan_continuation",
]

# What the next step receives for an interaction that timed out with on_timeout="continue".
TIMED_OUT = {"timed_out": True}


@dataclass(frozen=True, slots=True)
class NoOp:
    """Nothing to do: the run is not waiting at this boundary."""


@dataclass(frozen=True, slots=True)
class Hold:
    """Keep waiting: the boundary has not been fully dispatched yet."""


@dataclass(frozen=True, slots=True)
class RecordItem:
    """An item settled; others are still open."""

    settled: int
    items: int


@dataclass(frozen=True, slots=True)
class ReleaseScalar:
    input: bytes


@dataclass(frozen=True, slots=True)
class ReleaseItemized:
    input: bytes  # a JSON array of item outputs, in item-index order


@dataclass(frozen=True, slots=True)
class FailParent:
    error: str
    error_type: str


Plan = NoOp | Hold | RecordItem | ReleaseScalar | ReleaseItemized | FailParent


def plan_continuation(state: RunState, tolerance: Tolerance | None = None) -> Plan:
    """Decide the boundary's next move from the run's current interactions: from the
    boundary's counts (an admission to a boundary of many items reads none of them),
    reading its interactions in order only to fail or release.

    ``tolerance``: the failed items an itemized await tolerates (None: the first
    failure fails it); within it, the release is ``{"items": [...], "failed": [...]}``,
    null in ``items`` where an item failed."""
    if state.terminal or waits.of(state) is not waits.SUSPENDED:
        return NoOp()
    if not state.boundary.dispatched:
        return Hold()
    boundary = state.boundary
    if boundary.total == 0:  # a row stored before the counts were kept
        boundary = boundary.counted(state.interactions.values())
    total, failed = boundary.total, boundary.failed
    if failed and (tolerance is None or not tolerance.allows(failed, total)):
        failures = [i for i in state.boundary_interactions() if i.failed(boundary.on_timeout)]
        return _failure(failures, total, tolerance)
    if boundary.settled < total:
        return RecordItem(boundary.settled, total)
    interactions = state.boundary_interactions()
    if tolerance is not None and state.boundary.itemized:
        return ReleaseItemized(_tolerated(interactions, boundary.on_timeout))
    outputs = [_output(i) for i in interactions]
    if state.boundary.itemized:
        joined = b"[" + b",".join(outputs) + b"]"
        return ReleaseItemized(joined)
    return ReleaseScalar(outputs[0])


def _failure(failures: list[Interaction], total: int, tolerance: Tolerance | None) -> FailParent:
    first = failures[0]
    if first.status == "timed_out":
        error, error_type = "no completion before the deadline", "InteractionTimedOut"
    else:
        error = first.error or "the external system reported a failure"
        error_type = "BoundaryFailure"
    detail = f"item {first.item_index}: {error}"
    if tolerance is not None:
        detail = f"{len(failures)} of {total} items failed, more than tolerated ({detail})"
    return FailParent(detail, error_type)


def _tolerated(interactions: list[Interaction], on_timeout: str) -> bytes:
    """The release of an itemized await within its tolerance: outputs and failures."""
    outputs, failed = [], []
    for i in interactions:
        if i.failed(on_timeout):
            outputs.append(b"null")
            reason = "no completion before the deadline" if i.status == "timed_out" else i.error
            failed.append({"item": i.item_index, "error": reason})
        else:
            outputs.append(_output(i))
    listed = json.dumps(failed, separators=(",", ":"), sort_keys=True).encode()
    return b'{"failed":' + listed + b',"items":[' + b",".join(outputs) + b"]}"


def _output(interaction: Interaction) -> bytes:
    if interaction.status == "timed_out":
        return payload.dumps(TIMED_OUT)
    return interaction.output or b"null"
