"""Durable sleep and retry reasons through the processor loop, on both transports."""

from __future__ import annotations

import json
from collections.abc import Callable

from processor.clients.client import status_dict
from processor.facts.models import (
    RetryScheduled,
    RunFailed,
    SegmentFailed,
    SleepCompleted,
    SleepStarted,
)
from tests.apps.sleep_pipelines import NAP_S
from tests.control.control_support import Control

NAP_MS = int(NAP_S * 1000)


def _asleep(ctl: Control, run_id: str) -> SleepStarted:
    """Play the worker for the run's first segment; return the sleep it began."""
    ctl.complete(ctl.work(run_id))
    return ctl.wait_for(run_id, SleepStarted)[0]


def test_a_sleep_fires_once_and_the_next_step_gets_the_previous_output(ctl: Control) -> None:
    run_id = ctl.submit("nap", {"id": "s-1"})
    started = _asleep(ctl, run_id)
    assert started.wake_ms == started.time_ms + NAP_MS
    state = ctl.state(run_id)
    assert state.phase == "sleeping" and state.sleep.wake_ms == started.wake_ms
    assert status_dict(state)["sleeping"] == {"step": 1, "wake_ms": started.wake_ms}
    assert [(e.kind, e.due_ms) for e in ctl.due(run_id)] == [("sleep", started.wake_ms)]

    ctl.advance_to(started.wake_ms - 1)
    ctl.settle()
    assert ctl.of(run_id, SleepCompleted) == [] and ctl.no_new_work(run_id)

    ctl.advance_to(started.wake_ms)
    item = ctl.work(run_id)  # the step after the sleep, on what the step before returned
    assert item.first_step == 2 and json.loads(item.input) == {"id": "s-1", "prepared": True}
    ctl.complete(item)
    state = ctl.terminal(run_id)
    assert state.status == "succeeded"
    assert json.loads(state.result or b"") == {"shipped": {"id": "s-1", "prepared": True}}
    assert ctl.due(run_id) == []
    ctl.advance_to(started.wake_ms + NAP_MS)  # long after: nothing fires again
    ctl.settle()
    assert len(ctl.of(run_id, SleepCompleted)) == 1


def test_a_cancel_during_a_sleep_ends_it(ctl: Control) -> None:
    run_id = ctl.submit("nap", {"id": "s-2"})
    started = _asleep(ctl, run_id)
    ctl.cancel(run_id)
    state = ctl.terminal(run_id)
    assert (state.status, state.phase, state.sleep.wake_ms) == ("cancelled", "idle", None)
    assert ctl.due(run_id) == []
    ctl.advance_to(started.wake_ms)
    ctl.settle()
    assert ctl.of(run_id, SleepCompleted) == [] and ctl.no_new_work(run_id)


def test_the_run_deadline_during_a_sleep_ends_it(ctl: Control) -> None:
    run_id = ctl.submit("nap", {"id": "s-3"}, deadline_ms=ctl.now + NAP_MS // 2)
    started = _asleep(ctl, run_id)
    deadline = ctl.state(run_id).deadline_ms
    assert deadline is not None and deadline < started.wake_ms
    ctl.advance_to(deadline)
    state = ctl.terminal(run_id)
    assert state.status == "timed_out" and ctl.of(run_id, SleepCompleted) == []
    ctl.advance_to(started.wake_ms)
    ctl.settle()
    assert ctl.of(run_id, SleepCompleted) == [] and ctl.no_new_work(run_id)


def test_sleep_until_a_time_from_the_run_data(ctl: Control) -> None:
    wake = ctl.now + 12_345
    run_id = ctl.submit("alarm", {"wake_ms": wake})
    assert _asleep(ctl, run_id).wake_ms == wake
    ctl.advance_to(wake)
    ctl.complete(ctl.work(run_id))
    state = ctl.terminal(run_id)
    assert json.loads(state.result or b"") == {"rang": {"wake_ms": wake, "set": True}}


def test_a_restart_keeps_the_wake_time_and_the_sleep_fires_once(
    start: Callable[[Control | None], Control],
) -> None:
    ctl = start(None)
    run_id = ctl.submit("nap", {"id": "s-4"})
    started = _asleep(ctl, run_id)
    ctl.advance_to(started.wake_ms - 10)
    ctl = start(ctl)  # restarted later: the sleep is not measured again
    ctl.drive(lambda: ctl.h.loop_state(run_id) is not None, "the store restored")
    assert ctl.state(run_id).sleep.wake_ms == started.wake_ms
    assert [(e.kind, e.due_ms) for e in ctl.due(run_id)] == [("sleep", started.wake_ms)]
    ctl.advance_to(started.wake_ms)
    ctl.complete(ctl.work(run_id))
    assert ctl.terminal(run_id).status == "succeeded"
    assert len(ctl.of(run_id, SleepCompleted)) == 1


def test_retry_reasons_are_recorded_and_shown(ctl: Control) -> None:
    rejected = ctl.submit("picky", {"reject": True})
    ctl.complete(ctl.work(rejected))
    state = ctl.terminal(rejected)
    assert ctl.one(rejected, SegmentFailed).reason == "non_retryable"
    assert ctl.one(rejected, RunFailed).reason == "non_retryable"
    assert status_dict(state)["retry_reason"] == "non_retryable"

    flaky = ctl.submit("picky", {"flaky": True})
    state = ctl.play_timed(
        flaky, lambda: (s := ctl.h.loop_state(flaky)) and s.terminal and s, "flaky terminal"
    )
    assert [f.reason for f in ctl.of(flaky, SegmentFailed)] == ["eligible", "attempts_exhausted"]
    assert ctl.one(flaky, RetryScheduled).reason == "eligible"
    assert ctl.one(flaky, RunFailed).reason == "attempts_exhausted"
    assert state.attempt.retry_reason == "attempts_exhausted"
