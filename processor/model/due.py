"""Timers are durable data: the due-work rows a run needs, derived from its state.

The run's deadline is the run's own; every other timer is its wait's (``waits.py``):
a running attempt of either kind (a forward segment, a compensator) has the same
timers, its schedule-to-start timeout until a worker reports it started, then its own
timeout (start-to-close, or the compensation timeout) and its heartbeat timeout.
"""

from __future__ import annotations

from processor.model import waits
from processor.model.state import RunState
from processor.model.timers import ATTEMPT_TIMERS, DueEntry, TimerKind

__all__ = ["ATTEMPT_TIMERS", "DueEntry", "TimerKind", "due_entries"]


def due_entries(state: RunState | None) -> frozenset[DueEntry]:
    """Every timer the run currently waits on (none once terminal, none in quarantine)."""
    if state is None or state.terminal or state.quarantine is not None:
        return frozenset()
    deadline: frozenset[DueEntry] = frozenset()
    if state.deadline_ms is not None and state.stop.reason is None:
        deadline = frozenset({DueEntry(state.deadline_ms, state.run_id, "run_deadline")})
    armed = deadline | waits.of(state).arms(state)
    for lane in state.lane_views():  # a graph run's steps in flight
        armed |= waits.of(lane).arms(lane)
    return armed
