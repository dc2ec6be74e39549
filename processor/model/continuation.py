"""The continuation planner: what a boundary does after an admission or a timeout.

Pure: from the run (with the new fact folded in) to one immutable plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from processor.facts import payload
from processor.model import waits
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


def plan_continuation(state: RunState) -> Plan:
    """Decide the boundary's next move from the run's current interactions."""
    if state.terminal or waits.of(state) is not waits.SUSPENDED:
        return NoOp()
    if not state.boundary.dispatched:
        return Hold()
    interactions = state.boundary_interactions()
    failure = _failure(interactions, state.boundary.on_timeout)
    if failure is not None:
        return failure
    settled = [i for i in interactions if i.status != "open"]
    if len(settled) < len(interactions):
        return RecordItem(len(settled), len(interactions))
    outputs = [_output(i) for i in interactions]
    if state.boundary.itemized:
        joined = b"[" + b",".join(outputs) + b"]"
        return ReleaseItemized(joined)
    return ReleaseScalar(outputs[0])


def _failure(interactions: list[Interaction], on_timeout: str) -> FailParent | None:
    for interaction in interactions:
        if interaction.status == "admitted" and interaction.outcome == "failure":
            error = interaction.error or "the external system reported a failure"
            return FailParent(f"item {interaction.item_index}: {error}", "BoundaryFailure")
        if interaction.status == "timed_out" and on_timeout == "fail":
            return FailParent(
                f"item {interaction.item_index}: no completion before the deadline",
                "InteractionTimedOut",
            )
    return None


def _output(interaction: Interaction) -> bytes:
    if interaction.status == "timed_out":
        return payload.dumps(TIMED_OUT)
    return interaction.output or b"null"
