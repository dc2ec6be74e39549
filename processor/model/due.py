"""Timers are durable data: the due-work rows a run needs, derived from its state.

A running attempt of either kind (a forward segment, a compensator) has the same
timers: its schedule-to-start timeout until a worker reports it started, then its
own timeout (start-to-close, or the compensation timeout) and its heartbeat timeout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from processor.model.state import COMPENSATE, FORWARD, Attempt, AttemptKind, RunState

__all__ = ["ATTEMPT_TIMERS", "DueEntry", "TimerKind", "due_entries"]

TimerKind = Literal[
    "attempt_timeout",
    "retry",
    "interaction_timeout",
    "publication",
    "run_deadline",
    "compensation_timeout",
    "compensation_retry",
    "heartbeat_timeout",
    "schedule_to_start_timeout",
    "sleep",
]


@dataclass(frozen=True, slots=True, order=True)
class DueEntry:
    """One row of the due-work index, ordered by due time.

    ``scope``/``ordinal`` name what the timer is for: (segment, generation) for
    attempt timeouts (start-to-close, schedule-to-start, heartbeat) and retries,
    (compensated step, generation) for a compensator's (compensation timeout,
    schedule-to-start, heartbeat, retry), (boundary, item index) for interaction
    timeouts, (segment, step) for a sleep.
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
    if state.deadline_ms is not None and state.stop.reason is None:
        deadline = frozenset({DueEntry(state.deadline_ms, state.run_id, "run_deadline")})
    return deadline | _phase_entries(state)


#: Each kind of attempt's (timeout, retry) timers: one lifecycle, two sets of names.
ATTEMPT_TIMERS: dict[AttemptKind, tuple[TimerKind, TimerKind]] = {
    FORWARD: ("attempt_timeout", "retry"),
    COMPENSATE: ("compensation_timeout", "compensation_retry"),
}
#: Phase -> the kind of attempt that runs, or waits to be retried, in it.
_ATTEMPT_PHASES: dict[str, AttemptKind] = {
    "dispatched": FORWARD,
    "retry_wait": FORWARD,
    "compensating": COMPENSATE,
    "compensation_retry_wait": COMPENSATE,
}


def _phase_entries(state: RunState) -> frozenset[DueEntry]:
    run_id = state.run_id
    kind = _ATTEMPT_PHASES.get(state.phase)
    if kind is not None:
        attempt = state.attempt_of(kind)
        timeout, retry = ATTEMPT_TIMERS[kind]
        if attempt.running:
            return _running_entries(run_id, attempt, timeout)
        if attempt.waiting and attempt.retry_due_ms is not None:
            entry = DueEntry(attempt.retry_due_ms, run_id, retry, attempt.scope, attempt.generation)
            return frozenset({entry})
        return frozenset()
    if state.phase == "suspended":
        return frozenset(
            DueEntry(i.deadline_ms, run_id, "interaction_timeout", i.boundary, i.item_index)
            for i in state.boundary_interactions()
            if i.status == "open" and i.deadline_ms > 0
        )
    if state.phase == "sleeping" and state.sleep.wake_ms is not None:
        entry = DueEntry(
            state.sleep.wake_ms, run_id, "sleep", state.attempt.segment, state.sleep.step or 0
        )
        return frozenset({entry})
    if state.phase == "publishing" and state.publication.due_ms is not None:
        return frozenset({DueEntry(state.publication.due_ms, run_id, "publication")})
    return frozenset()


def _running_entries(run_id: str, attempt: Attempt, timeout: TimerKind) -> frozenset[DueEntry]:
    """A running attempt's timers, of either kind: schedule-to-start until a worker reports
    the start, then its own timeout (``timeout``: start-to-close, or the compensation
    timeout), and its heartbeat timer if any."""
    scope, ordinal = attempt.scope, attempt.generation
    entries = set()
    if attempt.expires_ms is not None:
        started = attempt.started_step is not None
        timer: TimerKind = timeout if started else "schedule_to_start_timeout"
        entries.add(DueEntry(attempt.expires_ms, run_id, timer, scope, ordinal))
    if attempt.heartbeat_due_ms is not None:
        entries.add(DueEntry(attempt.heartbeat_due_ms, run_id, "heartbeat_timeout", scope, ordinal))
    return frozenset(entries)
