"""The pure rules of schedules: next fire times, catch-up, overlap, jitter and the fold."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.facts.models import ScheduleCommand, ScheduleRecorded
from processor.model.schedules import (
    LATE_AFTER_MS,
    Refused,
    ScheduleSpec,
    ScheduleState,
    decide_command,
    fire_fact,
    fire_run_id,
    jitter_of,
    plan_fires,
    reduce_schedule,
)
from processor.transport.calendar import calendar, check_calendar

START = 1_800_000_000_000
SECOND = 1_000


def _spec(**changes: object) -> ScheduleSpec:
    base = ScheduleSpec("p", b"1", "UTC", START, interval_ms=SECOND)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def _state(**changes: object) -> ScheduleState:
    return ScheduleState("s", _spec(**changes), START)


def _apply(
    state: ScheduleState, now: int, *, running: bool = False
) -> tuple[ScheduleState, list[str]]:
    """Plan at ``now`` and fold the plan's facts; the kinds decided, with their fire times."""
    seen = []
    for fire in plan_fires(state, calendar(state.spec), now, last_run_running=running):
        after = reduce_schedule(state, fire_fact(state, fire, now, "tick"))
        assert after is not None
        state = after
        seen.append(f"{fire.kind}:{(fire.fire_ms - START) // SECOND}")
    return state, seen


# --- calendars ------------------------------------------------------------------------------


@given(st.integers(1, 10**7), st.integers(-(10**9), 10**9))
def test_an_interval_fires_on_its_grid_just_after_a_time(interval: int, offset: int) -> None:
    next_fire = calendar(_spec(interval_ms=interval))
    after = START + offset
    fire = next_fire(after)
    assert fire > after and fire > START
    assert (fire - START) % interval == 0
    assert fire - interval <= max(after, START)


def _utc(fire_ms: int) -> datetime:
    return datetime.fromtimestamp(fire_ms / 1000, UTC)


def test_a_cron_expression_is_read_in_its_time_zone_across_daylight_saving() -> None:
    nine_in_new_york = calendar(
        _spec(interval_ms=None, cron="0 9 * * *", timezone="America/New_York")
    )
    winter = nine_in_new_york(int(datetime(2026, 1, 10, tzinfo=UTC).timestamp() * 1000))
    summer = nine_in_new_york(int(datetime(2026, 7, 10, tzinfo=UTC).timestamp() * 1000))
    assert _utc(winter) == datetime(2026, 1, 10, 14, 0, tzinfo=UTC)  # EST: UTC-5
    assert _utc(summer) == datetime(2026, 7, 10, 13, 0, tzinfo=UTC)  # EDT: UTC-4


@given(st.integers(0, 4 * 10**11))
@settings(max_examples=50)
def test_a_cron_fire_time_is_after_the_time_given_and_matches(offset: int) -> None:
    every_quarter = calendar(_spec(interval_ms=None, cron="*/15 * * * *", timezone="Asia/Kolkata"))
    after = START + offset
    fire = every_quarter(after)
    assert after < fire <= after + 15 * 60 * SECOND
    assert fire % (15 * 60 * SECOND) == 0  # Kolkata is UTC+5:30: quarters line up with UTC


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"interval_ms": None, "cron": "61 * * * *"}, "bad_cron"),
        ({"interval_ms": None, "cron": "* * *"}, "bad_cron"),
        ({"timezone": "Nowhere/Atlantis"}, "unknown_time_zone"),
    ],
)
def test_an_unusable_calendar_is_refused_with_its_reason(
    changes: dict[str, object], reason: str
) -> None:
    refusal = check_calendar(_spec(**changes))
    assert refusal is not None and refusal[0] == reason


# --- catch-up -------------------------------------------------------------------------------


def test_on_time_a_schedule_fires_each_fire_time_once() -> None:
    state = _state()
    fired = []
    for now in range(START, START + 5 * SECOND + 1, 250):
        state, seen = _apply(state, now)
        fired += seen
    assert fired == [f"fired:{k}" for k in range(1, 6)]


def test_catch_up_skip_fires_nothing_late_and_records_the_missed() -> None:
    every_10s = _state(catch_up="skip", interval_ms=10 * SECOND)
    state, seen = _apply(every_10s, START + 100 * SECOND + LATE_AFTER_MS + 1)
    assert seen == ["skipped:100"]  # fire times 10 s .. 100 s, the latest late too
    assert state.skipped == 10 and state.fired == 0
    assert calendar(state.spec)(state.after_ms) == START + 110 * SECOND  # on from the next


def test_catch_up_skip_still_fires_the_latest_when_it_is_on_time() -> None:
    state, seen = _apply(_state(catch_up="skip"), START + 10 * SECOND + 500)
    assert seen == ["skipped:9", "fired:10"]  # 1 s .. 9 s skipped (recorded just before 10 s)
    assert state.skipped == 9 and state.last_run_id == fire_run_id("s", START + 10 * SECOND)


def test_catch_up_last_fires_the_latest_however_late() -> None:
    state, seen = _apply(_state(catch_up="last"), START + 10 * SECOND + 60 * SECOND)
    assert seen == ["skipped:69", "fired:70"]
    assert state.skipped == 69


def test_catch_up_all_fires_every_missed_time_up_to_its_limit_in_order() -> None:
    state, seen = _apply(_state(catch_up="all", catch_up_limit=4), START + 10 * SECOND)
    assert seen == ["skipped:6", "fired:7", "fired:8", "fired:9", "fired:10"]
    assert state.skipped == 6 and state.fired == 4
    _, everything = _apply(_state(catch_up="all", catch_up_limit=100), START + 10 * SECOND)
    assert everything == [f"fired:{k}" for k in range(1, 11)]


def test_a_very_long_downtime_skips_ahead_without_listing_every_fire_time() -> None:
    year = 365 * 86_400 * SECOND
    state, seen = _apply(_state(catch_up="all", catch_up_limit=2), START + year)
    assert seen[-2:] == [f"fired:{year // SECOND - 1}", f"fired:{year // SECOND}"]
    assert state.skipped == year // SECOND - 2


# --- overlap --------------------------------------------------------------------------------


def test_overlap_allow_fires_while_the_last_run_runs() -> None:
    _, seen = _apply(_state(overlap="allow"), START + SECOND, running=True)
    assert seen == ["fired:1"]


def test_overlap_skip_skips_while_the_last_run_runs() -> None:
    _, seen = _apply(_state(overlap="skip"), START + SECOND, running=True)
    assert seen == ["skipped:1"]


def test_overlap_skip_in_a_catch_up_fires_only_the_first() -> None:
    _, seen = _apply(_state(overlap="skip", catch_up="all"), START + 3 * SECOND)
    assert seen == ["fired:1", "skipped:2", "skipped:3"]


def test_overlap_queue_keeps_one_and_fires_it_when_the_last_run_ends() -> None:
    state = _state(overlap="queue")
    state, first = _apply(state, START + SECOND, running=True)
    state, second = _apply(state, START + 2 * SECOND, running=True)
    assert first == ["queued:1"] and second == ["skipped:2"]
    state, released = _apply(state, START + 2 * SECOND + 100, running=False)
    assert released == ["fired:1"]
    assert state.queued_fire_ms is None and state.last_run_id == fire_run_id("s", START + SECOND)
    _, later = _apply(state, START + 3 * SECOND, running=True)
    assert later == ["queued:3"]


# --- jitter ---------------------------------------------------------------------------------


@given(st.text(min_size=1, max_size=20), st.integers(0, 10**13), st.integers(0, 10**6))
def test_jitter_is_within_its_bound_and_the_same_at_every_redo(
    schedule_id: str, fire_ms: int, jitter_ms: int
) -> None:
    delay = jitter_of(schedule_id, fire_ms, jitter_ms)
    assert 0 <= delay <= jitter_ms
    assert delay == jitter_of(schedule_id, fire_ms, jitter_ms)


def test_a_jittered_fire_waits_for_its_delay_and_keeps_its_run_id() -> None:
    state = _state(jitter_ms=800)
    delay = jitter_of("s", START + SECOND, 800)
    _, early = _apply(state, START + SECOND + delay - 1)
    _, due = _apply(state, START + SECOND + delay)
    assert early == [] and due == ["fired:1"]


# --- exactly once, whatever crashes ---------------------------------------------------------


@given(
    st.lists(st.tuples(st.integers(1, 3_000), st.booleans()), min_size=1, max_size=40),
    st.sampled_from(["skip", "last", "all"]),
)
@settings(max_examples=200)
def test_each_fire_time_gets_at_most_one_run_and_none_is_lost_with_catch_up_all(
    rounds: list[tuple[int, bool]], catch_up: str
) -> None:
    """Rounds at increasing times, some of which crash before their commit (their
    decisions are lost and decided again later): every fire time is submitted at most
    once per committed round, never twice across them; with ``all`` every one is."""
    state = _state(catch_up=catch_up, catch_up_limit=1_000)
    now, submitted = START, []
    for step, crashed in rounds:
        now += step
        after, decided = state, []
        for fire in plan_fires(after, calendar(after.spec), now, last_run_running=False):
            fact = fire_fact(after, fire, now, "tick")
            folded = reduce_schedule(after, fact)
            assert folded is not None and reduce_schedule(folded, fact) == folded  # repeats
            after = folded
            if fire.kind == "fired":
                decided.append(fire.fire_ms)
        if not crashed:
            state, submitted = after, submitted + decided
    assert len(submitted) == len(set(submitted))
    assert submitted == sorted(submitted)
    if catch_up == "all":
        last = state.last_fire_ms
        expected = [] if last is None else list(range(START + SECOND, last + 1, SECOND))
        assert submitted == expected


# --- commands -------------------------------------------------------------------------------


def _create(**fields: object) -> ScheduleCommand:
    base: dict[str, object] = {
        "command_id": "c1",
        "schedule_id": "s",
        "action": "create",
        "requested_ms": START,
        "pipeline": "p",
        "input": b"1",
        "interval_ms": SECOND,
        "timezone": "UTC",
        "start_ms": START,
    }
    return ScheduleCommand(**{**base, **fields})  # type: ignore[arg-type]


def test_a_create_for_an_unknown_pipeline_is_refused() -> None:
    decided = decide_command(
        _create(pipeline="q"), None, START, pipelines=frozenset({"p"}), calendar_refusal=None
    )
    assert isinstance(decided, Refused) and decided.reason == "unknown_pipeline"


def test_the_same_create_twice_is_a_repeat_and_another_spec_is_refused() -> None:
    created = decide_command(
        _create(), None, START, pipelines=frozenset({"p"}), calendar_refusal=None
    )
    assert isinstance(created, ScheduleRecorded) and created.kind == "created"
    state = reduce_schedule(None, created)
    again = decide_command(
        _create(command_id="c2"), state, START, pipelines=frozenset({"p"}), calendar_refusal=None
    )
    other = decide_command(
        _create(interval_ms=5), state, START, pipelines=frozenset({"p"}), calendar_refusal=None
    )
    assert again is None
    assert isinstance(other, Refused) and other.reason == "schedule_exists"


def test_pause_resume_delete_of_an_unknown_schedule_are_refused() -> None:
    for action in ("pause", "resume", "delete"):
        command = ScheduleCommand(
            command_id="c", schedule_id="s", action=action, requested_ms=START
        )
        decided = decide_command(command, None, START, pipelines=frozenset(), calendar_refusal=None)
        assert isinstance(decided, Refused) and decided.reason == "unknown_schedule"


def test_a_resumed_schedule_does_not_fire_what_fell_due_while_paused() -> None:
    state = _state()
    paused = reduce_schedule(
        state,
        ScheduleRecorded(schedule_id="s", fact_key="p", kind="paused", time_ms=START, cause_id="c"),
    )
    assert (
        paused is not None
        and plan_fires(paused, calendar(paused.spec), START + 9 * SECOND, last_run_running=False)
        == []
    )
    resumed = reduce_schedule(
        paused,
        ScheduleRecorded(
            schedule_id="s",
            fact_key="r",
            kind="resumed",
            time_ms=START + 9500,
            cause_id="c",
            fire_ms=START + 9500,
        ),
    )
    assert resumed is not None
    _, seen = _apply(resumed, START + 10 * SECOND)
    assert seen == ["fired:10"]
