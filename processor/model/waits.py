"""Waits: what a run waits for in each phase, one declarative ``Wait`` per phase.

A run that is not running work waits: for a worker's result, a retry timer, a worker
that loads its version, outside input at a boundary, its sleep's timer, the terminal
publication, an operator, a compensator, or nothing. Each wait says:

- the phase it names (``phase``);
- the timers it arms, the run's due-work rows while it waits (``arms``, of the kinds
  ``timers``);
- how stop intent meets it: it is ``fenced`` (its timers go, the run waits no more),
  it ``holds_stop`` until it settles (the unwind waits), or ``while`` something of
  the state says so (``holds_stop_while``: a stop finds it fenced otherwise), or it is
  past stopping (``stoppable`` false: the execution completed);
- the attempt it runs or retries, if any (``runs``, ``retries``);
- how ``status`` shows it (``shown_as``: its key there, ``shows``: what is shown).

What a due timer of each kind decides is ``decide.TIMER_DECISIONS``, keyed by the
``timers`` declared here. The due index (``due.py``), the fold's fencing
(``reduce.py``), the stop (``control.py``, ``stop_notices.py``), the timer decisions, the
runs index and the status read the registry, ``WAITS``; none of them compares phase
strings. A new kind of wait is a ``Wait`` here, its phase in ``state.Phase`` and, for
a new kind of timer, its decision in ``decide.TIMER_DECISIONS``.

This module sits below the fold and the decisions (``pyproject.toml``'s import
contracts): ``reduce`` reads the fencing, and the decisions import ``reduce`` through
``FactMaker``, so a wait holds data and pure functions of the state, never a decision.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from processor.model import event_waits
from processor.model.state import COMPENSATE, FORWARD, Attempt, AttemptKind, Phase, RunState
from processor.model.timers import ATTEMPT_TIMERS, DueEntry, TimerKind

__all__ = [
    "COMPENSATING",
    "COMPENSATION_RETRY_WAIT",
    "DEFINITION_BLOCKED",
    "DISPATCHED",
    "IDLE",
    "PUBLISHING",
    "RETRY_WAIT",
    "SLEEPING",
    "SUSPENDED",
    "UNKNOWN",
    "WAITS",
    "Wait",
    "children_open",
    "held_by_stop",
    "holds_stop",
    "in_wait",
    "of",
    "status_views",
    "stop_held_by_children",
]

#: The due-work rows a run in a wait needs.
Arms = Callable[[RunState], frozenset[DueEntry]]
#: What ``status`` shows of a run in a wait (None: nothing).
Shows = Callable[[RunState], dict[str, Any] | None]
#: Whether a run in a wait holds a stop now (``Wait.holds_stop_while``).
Holds = Callable[[RunState], bool]

_NO_TIMERS: frozenset[DueEntry] = frozenset()


def _no_timers(state: RunState) -> frozenset[DueEntry]:
    return _NO_TIMERS


def _nothing_shown(state: RunState) -> dict[str, Any] | None:
    return None


@dataclass(frozen=True, slots=True)
class Wait:
    """What a run in ``phase`` waits for (see the module docstring for each field)."""

    phase: Phase
    arms: Arms = _no_timers
    timers: frozenset[TimerKind] = frozenset()
    fenced: bool = False  # stop intent ends it: its timers go, the run waits no more
    holds_stop: bool = False  # a stop waits for it to settle before the unwind begins
    holds_stop_while: Holds | None = None  # holds a stop while this is true, else fenced
    stoppable: bool = True  # False: the execution completed, no stop applies any more
    runs: AttemptKind | None = None  # the attempt a worker runs in it
    retries: AttemptKind | None = None  # the attempt that waits for its retry timer in it
    shown_as: str | None = None  # its key in ``status``, None unless the run is in it
    shows: Shows = _nothing_shown


# --- the timers each wait arms --------------------------------------------------------------


def _running(kind: AttemptKind) -> Arms:
    """A running attempt's timers, of either kind: schedule-to-start until a worker reports
    the start, then its own timeout (start-to-close, or the compensation timeout), and its
    heartbeat timer if any."""
    timeout = ATTEMPT_TIMERS[kind][0]

    def arms(state: RunState) -> frozenset[DueEntry]:
        attempt = state.attempt_of(kind)
        return _running_entries(state.run_id, attempt, timeout) if attempt.running else _NO_TIMERS

    return arms


def _running_entries(run_id: str, attempt: Attempt, timeout: TimerKind) -> frozenset[DueEntry]:
    scope, ordinal = attempt.scope, attempt.generation
    entries = set()
    if attempt.expires_ms is not None:
        started = attempt.started_step is not None
        timer: TimerKind = timeout if started else "schedule_to_start_timeout"
        entries.add(DueEntry(attempt.expires_ms, run_id, timer, scope, ordinal))
    if attempt.heartbeat_due_ms is not None:
        entries.add(DueEntry(attempt.heartbeat_due_ms, run_id, "heartbeat_timeout", scope, ordinal))
    return frozenset(entries)


def _retrying(kind: AttemptKind) -> Arms:
    """The retry timer of an attempt of ``kind`` waiting out its backoff."""
    retry = ATTEMPT_TIMERS[kind][1]

    def arms(state: RunState) -> frozenset[DueEntry]:
        attempt = state.attempt_of(kind)
        if not attempt.waiting or attempt.retry_due_ms is None:
            return _NO_TIMERS
        due = attempt.retry_due_ms
        return frozenset({DueEntry(due, state.run_id, retry, attempt.scope, attempt.generation)})

    return arms


def _interaction_timeouts(state: RunState) -> frozenset[DueEntry]:
    """The deadline of each open interaction of the boundary (0: none)."""
    return frozenset(
        DueEntry(i.deadline_ms, state.run_id, "interaction_timeout", i.boundary, i.item_index)
        for i in state.open_interactions()
        if i.deadline_ms > 0
    )


def children_open(state: RunState) -> bool:
    """Whether the run waits at a child boundary with a child still open: a stopping
    parent waits for its children's outcomes (each was sent a ``CancelRun``) before
    its unwind begins, as seed 002 says a parent does not terminalize before them."""
    if state.boundary.kind != "child":
        return False
    return any(i.kind == "child" for i in state.open_interactions())


def stop_held_by_children(state: RunState) -> bool:
    """Whether a stopping chain that no longer waits at its boundary still waits for
    children there: its child step failed (a child beyond the step's tolerance), the
    other children were sent a ``CancelRun``, and its unwind waits for their outcomes
    as a cancelled parent's does (graph runs do not wait: their node fails at once)."""
    return state.stopping and not state.graph and children_open(state)


def _held_children_timeouts(state: RunState) -> frozenset[DueEntry]:
    """The deadlines of the children a failed child step's stop waits for."""
    return _interaction_timeouts(state) if stop_held_by_children(state) else _NO_TIMERS


def _sleep_timer(state: RunState) -> frozenset[DueEntry]:
    wake_ms = state.sleep.wake_ms
    if wake_ms is None:
        return _NO_TIMERS
    segment, step = state.attempt.segment, state.sleep.step or 0
    return frozenset({DueEntry(wake_ms, state.run_id, "sleep", segment, step)})


def _publication_timer(state: RunState) -> frozenset[DueEntry]:
    due_ms = state.publication.due_ms
    if due_ms is None:
        return _NO_TIMERS
    return frozenset({DueEntry(due_ms, state.run_id, "publication")})


# --- what status shows of each wait ---------------------------------------------------------


def _boundary_view(state: RunState) -> dict[str, Any]:
    """The boundary a suspended run waits at, with its open interactions."""
    interactions = state.boundary_interactions()
    return {
        "boundary": state.boundary.number,
        "kind": state.boundary.kind,
        "itemized": state.boundary.itemized,
        "items": state.boundary.items,
        "open": sum(i.status == "open" for i in interactions),
        "admitted": sum(i.status == "admitted" for i in interactions),
        "timed_out": sum(i.status == "timed_out" for i in interactions),
        "next_deadline_ms": min(
            (i.deadline_ms for i in interactions if i.status == "open"), default=None
        ),
        **event_waits.shown(interactions),
    }


def _sleep_view(state: RunState) -> dict[str, Any]:
    """The sleep a sleeping run is in: its step and its wake time."""
    return {"step": state.sleep.step, "wake_ms": state.sleep.wake_ms}


def _blocked_view(state: RunState) -> dict[str, Any] | None:
    """What a ``definition_blocked`` run waits for: a live worker that loads its version."""
    if state.terminal:
        return None
    return {
        "pipeline": state.pipeline,
        "version": state.pipeline_version,
        "attempt": state.attempt.number,
        "next_step": state.attempt.next_step,
        "waiting_for": f"a live worker that loads {state.pipeline} v{state.pipeline_version}",
    }


# --- the registry ---------------------------------------------------------------------------

_ATTEMPT_TIMER_KINDS: frozenset[TimerKind] = frozenset(
    {"schedule_to_start_timeout", "heartbeat_timeout"}
)

#: A worker runs the forward attempt; a stop lets it settle (and tells it: ``stop_notices``).
DISPATCHED = Wait(
    "dispatched",
    arms=_running(FORWARD),
    timers=_ATTEMPT_TIMER_KINDS | {"attempt_timeout"},
    holds_stop=True,
    runs=FORWARD,
)
#: The forward attempt waits out its backoff; a stop fences the retry.
RETRY_WAIT = Wait(
    "retry_wait", arms=_retrying(FORWARD), timers=frozenset({"retry"}), fenced=True, retries=FORWARD
)
#: Outside input at a boundary; a stop fences its open interactions (and tells their
#: targets), except a child boundary's: the stop waits for the children's outcomes.
SUSPENDED = Wait(
    "suspended",
    arms=_interaction_timeouts,
    timers=frozenset({"interaction_timeout"}),
    fenced=True,
    holds_stop_while=children_open,
    shown_as="waiting",
    shows=_boundary_view,
)
#: Its sleep's wake time; a stop ends the sleep.
SLEEPING = Wait(
    "sleeping",
    arms=_sleep_timer,
    timers=frozenset({"sleep"}),
    fenced=True,
    shown_as="sleeping",
    shows=_sleep_view,
)
#: A live worker that loads the run's pinned version: no timer; a stop fences the wait.
DEFINITION_BLOCKED = Wait(
    "definition_blocked", fenced=True, shown_as="blocked", shows=_blocked_view
)
#: The terminal publication: the execution completed, so no stop applies any more.
PUBLISHING = Wait(
    "publishing", arms=_publication_timer, timers=frozenset({"publication"}), stoppable=False
)
#: An operator resolves the attempt whose outcome is unknown; a stop waits for it.
UNKNOWN = Wait("unknown", holds_stop=True)
#: A worker runs a compensator of the unwind (which begins only once stopping).
COMPENSATING = Wait(
    "compensating",
    arms=_running(COMPENSATE),
    timers=_ATTEMPT_TIMER_KINDS | {"compensation_timeout"},
    runs=COMPENSATE,
)
#: A compensator waits out its backoff: recovery goes on while stopping.
COMPENSATION_RETRY_WAIT = Wait(
    "compensation_retry_wait",
    arms=_retrying(COMPENSATE),
    timers=frozenset({"compensation_retry"}),
    retries=COMPENSATE,
)
#: Nothing: between two moves of one commit, or terminal; or, once a child step failed,
#: the outcomes of its other children, which the stop waits for (and their deadlines).
IDLE = Wait(
    "idle",
    arms=_held_children_timeouts,
    timers=frozenset({"interaction_timeout"}),
    holds_stop_while=stop_held_by_children,
)

#: Phase -> its wait; in this order, ``status`` shows the waits that it shows.
WAITS: Mapping[Phase, Wait] = MappingProxyType(
    {
        wait.phase: wait
        for wait in (
            DISPATCHED,
            RETRY_WAIT,
            SUSPENDED,
            SLEEPING,
            DEFINITION_BLOCKED,
            PUBLISHING,
            UNKNOWN,
            COMPENSATING,
            COMPENSATION_RETRY_WAIT,
            IDLE,
        )
    }
)
#: ``status``'s key of each wait it shows, None unless the run is in that wait.
_NOT_SHOWN: dict[str, dict[str, Any] | None] = {
    wait.shown_as: None for wait in WAITS.values() if wait.shown_as is not None
}


def of(state: RunState) -> Wait:
    """The wait of the run's phase."""
    return WAITS[state.phase]


def in_wait(state: RunState, wait: Wait) -> list[RunState]:
    """The run, or the lanes of a graph run, that are in ``wait``: their views."""
    return [view for view in (state, *state.lane_views()) if of(view) is wait]


def held_by_stop(state: RunState) -> bool:
    """Whether the run's wait (or a lane's: its view) holds a stop now."""
    wait = of(state)
    return wait.holds_stop or (wait.holds_stop_while is not None and wait.holds_stop_while(state))


def holds_stop(state: RunState) -> bool:
    """Whether the run, or any lane of a graph run, waits in a wait that holds a stop."""
    return any(held_by_stop(view) for view in (state, *state.lane_views()))


def status_views(state: RunState) -> dict[str, dict[str, Any] | None]:
    """Each shown wait's key in ``status``: what it shows if the run is in it, else None."""
    views = dict(_NOT_SHOWN)
    wait = WAITS[state.phase]
    if wait.shown_as is not None:
        views[wait.shown_as] = wait.shows(state)
    return views
