"""Schedules: start runs of a pipeline on a timetable, exactly one run per fire time.

Pure: a schedule's state is the fold of its ``ScheduleRecorded`` facts
(``reduce_schedule``); what is due at a time is ``plan_fires``, given the schedule's
calendar (``NextFire``: the first fire time after a time, computed outside the pure
core from a cron expression or an interval) and whether its last run still runs.
The run of a fire time has an id derived from the schedule id and that time
(``fire_run_id``), so deciding a fire twice submits the same run twice, and the
second submit is a no-op on the run's partition.

Policies:

- catch-up (``skip``, ``last``, ``all``): of the fire times due since the last one
  decided, ``skip`` fires only the latest and only if it is on time (at most
  ``LATE_AFTER_MS`` late); ``last`` fires the latest however late; ``all`` fires the
  latest ``catch_up_limit`` of them, in order. The others are recorded as skipped.
- overlap (``skip``, ``queue``, ``allow``): while the schedule's last run has not
  ended, ``skip`` skips a fire, ``queue`` keeps one fire (the first) to submit when
  it ends, ``allow`` submits regardless.
- jitter: a fire time ``t`` is submitted at ``t + jitter(t)``, from 0 to
  ``jitter_ms``, derived from the schedule id and ``t`` (a redo computes the same).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from processor.facts.models import (
    ScheduleCommand,
    ScheduledRunLinked,
    ScheduleRecorded,
    SubmitRun,
)
from processor.model.decision import FactMaker

__all__ = [
    "CATCH_UP",
    "LATE_AFTER_MS",
    "OVERLAP",
    "Fire",
    "NextFire",
    "Refused",
    "ScheduleSpec",
    "ScheduleState",
    "check_schedule_id",
    "check_spec",
    "decide_command",
    "fire_fact",
    "fire_run_id",
    "jitter_of",
    "link",
    "plan_fires",
    "reduce_schedule",
    "spec_of",
    "submit_refusal",
]

CATCH_UP = ("skip", "last", "all")
OVERLAP = ("skip", "queue", "allow")
#: A fire time decided later than this after it (plus its jitter) is late: missed.
LATE_AFTER_MS = 2_000
#: What a catch-up of ``all`` fires at most, whatever a schedule asks.
MAX_CATCH_UP = 1_000
_ID = re.compile(r"[A-Za-z0-9._-]{1,120}")

#: The first fire time strictly after a time (epoch ms): the schedule's calendar.
NextFire = Callable[[int], int]
FactKind = Literal["created", "paused", "resumed", "deleted", "fired", "skipped", "queued"]


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """What a schedule starts and when: a cron expression or an interval, in a zone."""

    pipeline: str
    input: bytes
    timezone: str
    start_ms: int  # intervals count from here; nothing fires at or before it
    cron: str | None = None
    interval_ms: int | None = None
    catch_up: str = "skip"
    catch_up_limit: int = 10
    overlap: str = "allow"
    jitter_ms: int = 0


@dataclass(frozen=True, slots=True)
class ScheduleState:
    """A schedule as its facts leave it."""

    schedule_id: str
    spec: ScheduleSpec
    created_ms: int
    paused: bool = False
    deleted: bool = False
    last_fire_ms: int | None = None  # the latest fire time decided (fired, skipped, queued)
    last_fired_ms: int | None = None  # the latest fire time that submitted a run
    last_run_id: str | None = None  # that run
    queued_fire_ms: int | None = None  # a fire waiting for the last run to end
    fired: int = 0
    skipped: int = 0

    @property
    def after_ms(self) -> int:
        """Fire times after this one are still to be decided."""
        return self.spec.start_ms if self.last_fire_ms is None else self.last_fire_ms


def check_schedule_id(schedule_id: str) -> str | None:
    """Why ``schedule_id`` cannot name a schedule (None: it can)."""
    if _ID.fullmatch(schedule_id) is None:
        return "a schedule id is 1 to 120 letters, digits, '.', '_' or '-'"
    return None


def check_spec(spec: ScheduleSpec) -> tuple[str, str] | None:
    """(reason, detail) of what is wrong with ``spec`` but its calendar; None if nothing."""
    if (spec.cron is None) == (spec.interval_ms is None):
        return "bad_schedule", "give a cron expression or an interval, not both or neither"
    if spec.interval_ms is not None and spec.interval_ms < 1:
        return "bad_interval", f"an interval is at least 1 ms, got {spec.interval_ms}"
    if spec.catch_up not in CATCH_UP:
        return "bad_policy", f"catch-up is one of {', '.join(CATCH_UP)}, got {spec.catch_up!r}"
    if spec.overlap not in OVERLAP:
        return "bad_policy", f"overlap is one of {', '.join(OVERLAP)}, got {spec.overlap!r}"
    if not 1 <= spec.catch_up_limit <= MAX_CATCH_UP:
        return "bad_policy", f"the catch-up limit is from 1 to {MAX_CATCH_UP}"
    if spec.jitter_ms < 0:
        return "bad_policy", "jitter is 0 ms or more"
    return None


def fire_run_id(schedule_id: str, fire_ms: int) -> str:
    """The run of a fire time: ``<schedule id>@<fire time ms>`` (ids hold no '@')."""
    return f"{schedule_id}@{fire_ms}"


def jitter_of(schedule_id: str, fire_ms: int, jitter_ms: int) -> int:
    """The delay of a fire time, from 0 to ``jitter_ms``, the same at every redo."""
    if jitter_ms <= 0:
        return 0
    digest = hashlib.sha256(f"{len(schedule_id)}:{schedule_id}:{fire_ms}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % (jitter_ms + 1)


# --- the fold --------------------------------------------------------------------------


def spec_of(fact: ScheduleRecorded | ScheduleCommand) -> ScheduleSpec:
    """The spec a ``created`` fact (or a create command) carries."""
    return ScheduleSpec(
        pipeline=fact.pipeline or "",
        input=fact.input or b"null",
        timezone=fact.timezone or "UTC",
        start_ms=fact.start_ms or 0,
        cron=fact.cron,
        interval_ms=fact.interval_ms,
        catch_up=fact.catch_up or "skip",
        catch_up_limit=fact.catch_up_limit or 10,
        overlap=fact.overlap or "allow",
        jitter_ms=fact.jitter_ms or 0,
    )


def reduce_schedule(state: ScheduleState | None, fact: ScheduleRecorded) -> ScheduleState | None:
    """The schedule after ``fact``; an unknown kind changes nothing."""
    if fact.kind == "created":
        if state is not None and not state.deleted:
            return state
        return ScheduleState(fact.schedule_id, spec_of(fact), fact.time_ms)
    if state is None:
        return None
    replace = dataclasses.replace
    fire = fact.fire_ms if fact.fire_ms is not None else state.after_ms
    later = max(state.after_ms, fire)
    if _repeated(state, fact, fire):
        return state
    match fact.kind:
        case "paused":
            return replace(state, paused=True)
        case "resumed":  # what fell due while paused is not fired
            return replace(state, paused=False, last_fire_ms=later, queued_fire_ms=None)
        case "deleted":
            return replace(state, deleted=True, queued_fire_ms=None)
        case "fired":
            newest = state.last_fired_ms is None or fire >= state.last_fired_ms
            queued = None if state.queued_fire_ms == fire else state.queued_fire_ms
            return replace(
                state,
                last_fire_ms=later,
                last_fired_ms=fire if newest else state.last_fired_ms,
                last_run_id=fact.run_id if newest else state.last_run_id,
                queued_fire_ms=queued,
                fired=state.fired + 1,
            )
        case "skipped":
            return replace(state, last_fire_ms=later, skipped=state.skipped + (fact.count or 1))
        case "queued":
            return replace(state, last_fire_ms=later, queued_fire_ms=fire)
    return state


def _repeated(state: ScheduleState, fact: ScheduleRecorded, fire: int) -> bool:
    """Whether a fire fact is one the state holds already (decided fire times only
    move forward: a queued fire is later than the last fired one)."""
    if fact.kind == "fired":
        return state.last_fired_ms is not None and fire <= state.last_fired_ms
    if fact.kind in ("skipped", "queued"):
        return state.last_fire_ms is not None and fire <= state.last_fire_ms
    return False


# --- what is due -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Fire:
    """One decision about a fire time: fire it, skip it (with a reason), or queue it."""

    kind: Literal["fired", "skipped", "queued"]
    fire_ms: int
    reason: str = ""
    count: int = 1


def _due(
    state: ScheduleState, next_fire: NextFire, now_ms: int, most: int
) -> tuple[list[int], int]:
    """The latest ``most`` fire times due by ``now_ms`` (their jitter passed), in order,
    and how many earlier ones are due too."""
    spec, due, earlier = state.spec, [], 0
    fire = next_fire(state.after_ms)
    while fire + jitter_of(state.schedule_id, fire, spec.jitter_ms) <= now_ms:
        due.append(fire)
        if len(due) > most:
            due.pop(0)
            earlier += 1
        if earlier > 100 * MAX_CATCH_UP:  # years of downtime: skip ahead to the end
            return _due_from_end(state, next_fire, now_ms, most, earlier)
        fire = next_fire(fire)
    return due, earlier


def _due_from_end(
    state: ScheduleState, next_fire: NextFire, now_ms: int, most: int, earlier: int
) -> tuple[list[int], int]:
    """``_due`` for a very long downtime: only an interval can skip ahead in one step."""
    interval = state.spec.interval_ms
    if interval is None:
        return [], earlier  # a cron schedule skips what it could count; it goes on next tick
    start = state.spec.start_ms
    last = start + ((now_ms - start) // interval) * interval
    due = [t for t in range(last - (most - 1) * interval, last + 1, interval) if t > state.after_ms]
    skipped = (last - state.after_ms) // interval - len(due)
    return due, max(0, skipped)


def plan_fires(
    state: ScheduleState, next_fire: NextFire, now_ms: int, *, last_run_running: bool
) -> list[Fire]:
    """What to decide about the fire times due by ``now_ms``, in order (pure)."""
    if state.paused or state.deleted:
        return []
    spec = state.spec
    running = last_run_running
    plan: list[Fire] = []
    if state.queued_fire_ms is not None and not running:
        plan.append(Fire("fired", state.queued_fire_ms))
        running = True
    most = spec.catch_up_limit if spec.catch_up == "all" else 1
    due, earlier = _due(state, next_fire, now_ms, most)
    if not due:
        return plan
    if spec.catch_up == "skip" and _late(state, due[-1], now_ms):
        return [*plan, Fire("skipped", due[-1], "missed", earlier + len(due))]
    if earlier:
        plan.append(Fire("skipped", due[0] - 1, "missed", earlier))
    queued = state.queued_fire_ms is not None and not plan
    for fire in due:
        if not running or spec.overlap == "allow":
            plan.append(Fire("fired", fire))
            running = True
        elif spec.overlap == "queue" and not queued:
            plan.append(Fire("queued", fire))
            queued = True
        else:
            plan.append(Fire("skipped", fire, "overlap"))
    return plan


def _late(state: ScheduleState, fire: int, now_ms: int) -> bool:
    return now_ms - fire - jitter_of(state.schedule_id, fire, state.spec.jitter_ms) > LATE_AFTER_MS


# --- commands and facts ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Refused:
    """A command refused: the reason users grep, and a detail."""

    reason: str
    detail: str


def _recorded(
    schedule_id: str, key: str, kind: FactKind, now_ms: int, cause: str, **fields: object
) -> ScheduleRecorded:
    return ScheduleRecorded(
        schedule_id=schedule_id, fact_key=key, kind=kind, time_ms=now_ms, cause_id=cause, **fields
    )


def decide_command(
    command: ScheduleCommand,
    state: ScheduleState | None,
    now_ms: int,
    *,
    pipelines: frozenset[str],
    calendar_refusal: tuple[str, str] | None,
) -> ScheduleRecorded | Refused | None:
    """The fact a command records, its refusal, or None (a repeat: nothing to do)."""
    sid, cause, live = (
        command.schedule_id,
        command.command_id,
        state is not None and not state.deleted,
    )
    bad_id = check_schedule_id(sid)
    if bad_id is not None:
        return Refused("bad_schedule_id", bad_id)
    if command.action == "create":
        return _decide_create(command, state, now_ms, pipelines, calendar_refusal)
    if not live:
        return Refused("unknown_schedule", f"no schedule named {sid!r}")
    assert state is not None
    match command.action:
        case "pause":
            return (
                None if state.paused else _recorded(sid, f"paused/{cause}", "paused", now_ms, cause)
            )
        case "resume":
            if not state.paused:
                return None
            return _recorded(sid, f"resumed/{cause}", "resumed", now_ms, cause, fire_ms=now_ms)
        case "delete":
            return _recorded(sid, f"deleted/{cause}", "deleted", now_ms, cause)
    return Refused(
        "unknown_action",
        f"a schedule command is create, pause, resume or delete, not {command.action!r}",
    )


def _decide_create(
    command: ScheduleCommand,
    state: ScheduleState | None,
    now_ms: int,
    pipelines: frozenset[str],
    calendar_refusal: tuple[str, str] | None,
) -> ScheduleRecorded | Refused | None:
    spec = spec_of(command)
    if spec.pipeline not in pipelines:
        return Refused("unknown_pipeline", f"no pipeline named {spec.pipeline!r}")
    wrong = check_spec(spec) or calendar_refusal
    if wrong is not None:
        return Refused(*wrong)
    if state is not None and not state.deleted:
        if dataclasses.replace(spec, start_ms=state.spec.start_ms) == state.spec:
            return None  # the same create again (a retry, later: its start differs)
        return Refused(
            "schedule_exists", f"schedule {command.schedule_id!r} exists with another spec"
        )
    sid, cause = command.schedule_id, command.command_id
    fields = dataclasses.asdict(spec)
    return _recorded(sid, f"created/{cause}", "created", now_ms, cause, **fields)


def fire_fact(state: ScheduleState, fire: Fire, now_ms: int, cause: str) -> ScheduleRecorded:
    """The fact that records ``fire``: keyed by kind and fire time, so a redo is the same."""
    sid = state.schedule_id
    run_id = fire_run_id(sid, fire.fire_ms) if fire.kind == "fired" else None
    return _recorded(
        sid,
        f"{fire.kind}/{fire.fire_ms}",
        fire.kind,
        now_ms,
        cause,
        fire_ms=fire.fire_ms,
        run_id=run_id,
        reason=fire.reason or None,
        count=fire.count if fire.kind == "skipped" else None,
    )


def submit_refusal(command: SubmitRun) -> tuple[str, str] | None:
    """Why a submit that names a schedule may not start its run (reason, detail), or
    None: a scheduled run's id is its schedule's and fire time's (``fire_run_id``), so
    a label that does not match the run is refused rather than shown."""
    if command.schedule_id is None and command.fire_ms is None:
        return None
    if command.schedule_id is None or command.fire_ms is None:
        return "invalid_command", "a scheduled run names both its schedule and its fire time"
    expected = fire_run_id(command.schedule_id, command.fire_ms)
    if command.run_id != expected:
        return "invalid_command", f"the run of that fire time is {expected}, not {command.run_id}"
    return None


def link(maker: FactMaker, command: SubmitRun) -> None:
    """Record a scheduled run's schedule and fire time (after its ``RunSubmitted``)."""
    if command.schedule_id is None or command.fire_ms is None:
        return
    maker.add(
        ScheduledRunLinked(
            **maker.header("schedule/linked"),
            schedule_id=command.schedule_id,
            fire_ms=command.fire_ms,
        )
    )
