"""Timers are durable data: one row of the due-work index, and the kinds of timer.

The rows a run needs are derived from its state by ``due.py``, through its wait
(``waits.py``); what a due row decides is ``decide.decide_timer``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from processor.model.state import COMPENSATE, FORWARD, AttemptKind

__all__ = ["ATTEMPT_TIMERS", "DueEntry", "TimerKind"]

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


#: Each kind of attempt's (timeout, retry) timers: one lifecycle, two sets of names.
ATTEMPT_TIMERS: dict[AttemptKind, tuple[TimerKind, TimerKind]] = {
    FORWARD: ("attempt_timeout", "retry"),
    COMPENSATE: ("compensation_timeout", "compensation_retry"),
}
