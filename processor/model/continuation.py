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
    """Decide the boundary's next move from the run's current interactions.

    ``tolerance``: the failed items an itemized await tolerates (None: the first
    failure fails it); within it, the release is ``{"items": [...], "failed": [...]}``,
    null in ``items`` where an item failed."""
    if state.terminal or waits.of(state) is not waits.SUSPENDED:
        return NoOp()
    if not state.boundary.dispatched:
        return Hold()
    # One pass, in no order, for the counts (an admission to a boundary of many items
    # asks this each time); the items are put in order only to fail or release.
    number, on_timeout = state.boundary.number, state.boundary.on_timeout
    total = settled = 0
    failures: list[Interaction] = []
    for interaction in state.interactions.values():
        if interaction.boundary != number:
            continue
        total += 1
        settled += interaction.status in _SETTLED
        if _failed(interaction, on_timeout):
            failures.append(interaction)
    if failures and (tolerance is None or not tolerance.allows(len(failures), total)):
        return _failure(sorted(failures, key=_item_index), total, tolerance)
    if settled < total:
        return RecordItem(settled, total)
    interactions = state.boundary_interactions()
    if tolerance is not None and state.boundary.itemized:
        return ReleaseItemized(_tolerated(interactions, on_timeout))
    outputs = [_output(i) for i in interactions]
    if state.boundary.itemized:
        joined = b"[" + b",".join(outputs) + b"]"
        return ReleaseItemized(joined)
    return ReleaseScalar(outputs[0])


def _item_index(interaction: Interaction) -> int:
    return interaction.item_index


#: An interaction's statuses once it settled (queued and open ones have not).
_SETTLED = frozenset({"admitted", "timed_out"})


def _failed(interaction: Interaction, on_timeout: str) -> bool:
    if interaction.status == "admitted":
        return interaction.outcome == "failure"
    return interaction.status == "timed_out" and on_timeout == "fail"


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
        if _failed(i, on_timeout):
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
