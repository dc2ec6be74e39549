"""Timers are durable data: the due-work rows a run needs, derived from its state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from processor.model.state import RunState

__all__ = ["DueEntry", "TimerKind", "due_entries"]

TimerKind = Literal[
    "attempt_timeout",
    "retry",
    "interaction_timeout",
    "publication",
    "run_deadline",
    "compensation_timeout",
    "compensation_retry",
]


@dataclass(frozen=True, slots=True, order=True)
class DueEntry:
    """One row of the due-work index, ordered by due time.

    ``scope``/``ordinal`` name what the timer is for: (segment, generation) for
    attempt timeouts and retries, (boundary, item index) for interaction timeouts.
    """

    due_ms: int
    run_id: str
    kind: TimerKind
    scope: int = 0
    ordinal: int = 0


def due_entries(state: RunState | None) -> frozenset[DueEntry]:
    """Every timer the run currently waits on (none once terminal)."""
    if state is None or state.terminal:
        return frozenset()
    deadline: frozenset[DueEntry] = frozenset()
    if state.deadline_ms is not None and state.stop_reason is None:
        deadline = frozenset({DueEntry(state.deadline_ms, state.run_id, "run_deadline")})
    return deadline | _phase_entries(state)


def _phase_entries(state: RunState) -> frozenset[DueEntry]:
    run_id = state.run_id
    if state.phase == "compensating" and state.compensation_expires_ms is not None:
        step, generation = state.compensating_step or 0, state.compensation_generation
        expiry = state.compensation_expires_ms
        return frozenset({DueEntry(expiry, run_id, "compensation_timeout", step, generation)})
    if state.phase == "compensation_retry_wait" and state.compensation_retry_due_ms is not None:
        step, generation = state.compensating_step or 0, state.compensation_generation
        due = state.compensation_retry_due_ms
        return frozenset({DueEntry(due, run_id, "compensation_retry", step, generation)})
    if state.phase == "dispatched" and state.attempt_expires_ms is not None:
        expiry = state.attempt_expires_ms
        return frozenset(
            {DueEntry(expiry, run_id, "attempt_timeout", state.segment, state.generation)}
        )
    if state.phase == "retry_wait" and state.retry_due_ms is not None:
        return frozenset(
            {DueEntry(state.retry_due_ms, run_id, "retry", state.segment, state.generation)}
        )
    if state.phase == "suspended":
        return frozenset(
            DueEntry(i.deadline_ms, run_id, "interaction_timeout", i.boundary, i.item_index)
            for i in state.boundary_interactions()
            if i.status == "open" and i.deadline_ms > 0
        )
    if state.phase == "publishing" and state.publication_due_ms is not None:
        return frozenset({DueEntry(state.publication_due_ms, run_id, "publication")})
    return frozenset()
