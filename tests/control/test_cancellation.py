"""Cancellation: one stop intent, fencing of queued work and open interactions, settling."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

from processor.facts.models import (
    BoundaryCompletionAdmitted,
    CompensationAttemptStarted,
    CompensationStarted,
    CompensationStepCompleted,
    CompensationStepSkipped,
    InteractionTimedOut,
    RetryScheduled,
    RunFailed,
    RunStopped,
    RunStopRequested,
    SegmentAttemptStarted,
    SegmentFailed,
    StepCompleted,
)
from tests.control.control_support import Control


def test_stop_intent_commits_once_and_a_later_stop_never_replaces_it(ctl: Control) -> None:
    run_id = ctl.submit("timed", {"id": "c-1"})
    item = ctl.work(run_id)  # the first attempt is running
    deadline = ctl.state(run_id).deadline_ms
    assert deadline is not None and ctl.now < deadline

    client = ctl.client()
    try:
        with ThreadPoolExecutor(1) as pool:  # `processor cancel` waits for the reply
            future = pool.submit(client.cancel, run_id, "customer changed their mind", wait_s=30)
            ctl.drive(future.done, "Client.cancel to get its reply")
            first = future.result()
    finally:
        client.close()
    assert first is not None and (first.created, first.refusal) == (True, None)
    assert json.loads(first.response or "{}")["stop"] == "cancelled"
    stop = ctl.one(run_id, RunStopRequested)
    assert (stop.reason, stop.detail) == ("cancelled", "customer changed their mind")
    count = ctl.facts_count(run_id)

    again, _ = ctl.cancel(run_id, "asked twice")  # a repeat: answered, but no fact
    repeat = ctl.reply(again)
    assert (repeat.created, repeat.refusal) == (False, None)
    assert "already stopping: cancelled" in (repeat.detail or "")
    assert ctl.facts_count(run_id) == count

    ctl.advance_to(deadline + 1)  # a different, later stop reason: it changes nothing
    ctl.settle()
    assert ctl.facts_count(run_id) == count
    assert ctl.due(run_id) == []  # no run_deadline row (nor a timer: nobody started it)

    ctl.complete(item)  # the running attempt settles; then the unwind
    ctl.complete(ctl.work(run_id, "compensate"))
    state = ctl.terminal(run_id)
    assert (state.status, state.execution, state.recovery) == (
        "cancelled",
        "Cancelled",
        "Compensated",
    )
    assert ctl.one(run_id, RunStopRequested) == stop
    assert ctl.one(run_id, RunStopped).detail == "customer changed their mind"

    late, _ = ctl.cancel(run_id)
    assert ctl.reply(late).refusal == "run_terminal"
    assert ctl.facts_count(run_id) == state.version


def test_stop_fences_a_queued_retry(ctl: Control) -> None:
    run_id = ctl.submit("booking", {"id": "c-2", "transient": True})
    ctl.complete(ctl.work(run_id))  # `reserve` failed, retryably: a retry is queued
    retry = ctl.one(run_id, RetryScheduled)
    assert ctl.state(run_id).phase == "retry_wait"
    assert [e.kind for e in ctl.due(run_id)] == ["retry"]

    command, _ = ctl.cancel(run_id)
    assert ctl.reply(command).created is True
    state = ctl.terminal(run_id)  # nothing runs and nothing completed: stopped at once
    assert (state.execution, state.recovery) == ("Cancelled", "NotRequired")
    assert ctl.due(run_id) == []

    ctl.advance_to(retry.due_ms + 60_000)
    ctl.settle()
    assert len(ctl.of(run_id, SegmentAttemptStarted)) == 1
    assert ctl.no_new_work(run_id)
    assert ctl.types(run_id)[-2:] == ["RunStopRequested", "RunStopped"]


def test_stop_fences_a_pending_await_and_a_later_completion_is_refused(ctl: Control) -> None:
    run_id = ctl.submit("approval", {"n": 3})
    request = ctl.until_suspended(run_id)
    assert [e.kind for e in ctl.due(run_id)] == ["interaction_timeout"]

    command, _ = ctl.cancel(run_id)
    assert ctl.reply(command).created is True
    # The interaction's timer is gone with the stop; the unwind began (its compensator
    # has no timer until a worker reports it started).
    assert ctl.state(run_id).phase == "compensating" and ctl.due(run_id) == []
    compensation = ctl.work(run_id, "compensate")

    answer = ctl.complete_interaction(request, {"ok": True})  # while the run still stops
    assert ctl.rejection(answer).reason == "run_terminal"
    assert not ctl.state(run_id).terminal
    assert ctl.of(run_id, BoundaryCompletionAdmitted) == []
    assert ctl.of(run_id, InteractionTimedOut) == []

    ctl.complete(compensation)
    state = ctl.terminal(run_id)
    assert (state.execution, state.recovery) == ("Cancelled", "Compensated")
    again = ctl.complete_interaction(request, {"ok": True})
    assert ctl.rejection(again).reason == "run_terminal"
    assert ctl.of(run_id, BoundaryCompletionAdmitted) == []
    assert ctl.of(run_id, InteractionTimedOut) == []


def test_an_attempt_already_running_settles_before_the_run_finishes_stopping(
    ctl: Control,
) -> None:
    run_id = ctl.submit("booking", {"id": "c-4", "reject": True})
    item = ctl.work(run_id)
    command, _ = ctl.cancel(run_id)
    assert ctl.reply(command).created is True
    ctl.settle()
    state = ctl.state(run_id)
    assert state.stop.reason == "cancelled" and not state.terminal
    assert state.phase == "dispatched"  # still owned by the running attempt
    assert ctl.of(run_id, CompensationStarted) == []
    assert ctl.no_new_work(run_id)

    ctl.complete(item)  # three steps completed while cancelling, then `confirm` refused
    assert [f.step for f in ctl.of(run_id, StepCompleted)] == [0, 1, 2]
    failed = ctl.one(run_id, SegmentFailed)
    assert (failed.step, failed.retryable) == (3, False)
    assert ctl.one(run_id, CompensationStarted).steps == (2, 1, 0)  # includes the late steps
    assert [f.step for f in ctl.of(run_id, CompensationStepSkipped)] == [2]
    for expected in (1, 0):
        compensation = ctl.work(run_id, "compensate")
        assert compensation.first_step == expected
        ctl.complete(compensation)
    state = ctl.terminal(run_id)
    assert ctl.of(run_id, RunFailed) == []  # the first stop reason decides: cancelled
    assert (state.execution, state.recovery) == ("Cancelled", "PartiallyCompensated")
    assert [f.step for f in ctl.of(run_id, CompensationStepCompleted)] == [1, 0]
    assert len(ctl.of(run_id, CompensationAttemptStarted)) == 2
