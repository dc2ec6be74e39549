"""Timers are durable data: the due-work rows a run needs, derived from its state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from processor.model.state import COMPENSATE, FORWARD, AttemptKind, RunState

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
    (boundary, item index) for interaction timeouts, (segment, step) for a sleep.
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
        if kind == FORWARD and attempt.running:
            return _forward_entries(state)
        if attempt.running and attempt.expires_ms is not None:
            due, timer = attempt.expires_ms, timeout
        elif attempt.waiting and attempt.retry_due_ms is not None:
            due, timer = attempt.retry_due_ms, retry
        else:
            return frozenset()
        return frozenset({DueEntry(due, run_id, timer, attempt.scope, attempt.generation)})
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


def _forward_entries(state: RunState) -> frozenset[DueEntry]:
    """A dispatched forward attempt's timers: schedule-to-start until a worker reports the
    start, then start-to-close (``attempt_timeout``), and its heartbeat timer if any."""
    forward = state.attempt
    scope, ordinal = forward.segment, forward.generation
    entries = set()
    if forward.expires_ms is not None:
        started = forward.started_step is not None
        timer: TimerKind = "attempt_timeout" if started else "schedule_to_start_timeout"
        entries.add(DueEntry(forward.expires_ms, state.run_id, timer, scope, ordinal))
    if forward.heartbeat_due_ms is not None:
        entries.add(
            DueEntry(forward.heartbeat_due_ms, state.run_id, "heartbeat_timeout", scope, ordinal)
        )
    return frozenset(entries)
