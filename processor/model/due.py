"""Timers are durable data: the due-work rows a run needs, derived from its state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from processor.model.state import RunState

__all__ = ["DueEntry", "TimerKind", "due_entries"]

TimerKind = Literal["attempt_timeout", "retry"]


@dataclass(frozen=True, slots=True, order=True)
class DueEntry:
    """One row of the due-work index, ordered by due time."""

    due_ms: int
    run_id: str
    kind: TimerKind
    segment: int
    generation: int


def due_entries(state: RunState | None) -> frozenset[DueEntry]:
    """Every timer the run currently waits on (none once terminal)."""
    if state is None or state.terminal:
        return frozenset()
    if state.phase == "dispatched" and state.attempt_expires_ms is not None:
        return frozenset(
            {
                DueEntry(
                    state.attempt_expires_ms,
                    state.run_id,
                    "attempt_timeout",
                    state.segment,
                    state.generation,
                )
            }
        )
    if state.phase == "retry_wait" and state.retry_due_ms is not None:
        return frozenset(
            {DueEntry(state.retry_due_ms, state.run_id, "retry", state.segment, state.generation)}
        )
    return frozenset()
