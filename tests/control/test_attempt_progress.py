"""Timers from the worker's start, heartbeats and lost attempts, on both transports.

The test plays the worker: it sends AttemptProgress reports to segments.results with
the real transport (the worker runtime sends the same ones), and moves the fake clock.
Compensators follow the same rules as forward attempts (the last tests).
"""

from __future__ import annotations

from processor.clients.client import status_dict
from processor.facts.models import (
    AttemptHeartbeatRecorded,
    AttemptLost,
    AttemptOutcomeUnknown,
    AttemptStepStarted,
    CompensationAttemptFailed,
    CompensationStepCompleted,
    SegmentFailed,
)
from tests.apps.control_pipelines import (
    COMPENSATION_TIMEOUT_S,
    HEARTBEAT_TIMEOUT_S,
    START_TIMEOUT_S,
    STEP_TIMEOUT_S,
    UNDO_TIMEOUT_S,
    WATCHED_TIMEOUT_S,
)
from tests.control.control_support import Control

HEARTBEAT_MS = int(HEARTBEAT_TIMEOUT_S * 1000)
START_MS = int(START_TIMEOUT_S * 1000)
COMPENSATION_MS = int(COMPENSATION_TIMEOUT_S * 1000)
UNDO_MS = int(UNDO_TIMEOUT_S * 1000)
# From the start of crunch: its timeout and that of report, the segment's later step.
STARTED_TIMEOUT_MS = int((WATCHED_TIMEOUT_S + STEP_TIMEOUT_S) * 1000)


def test_fifty_runs_queued_behind_one_busy_worker_all_succeed(ctl: Control) -> None:
    """Fifty effectful payments wait for one worker far longer than their 5 s timeout:
    time in the queue does not count, so none is lost (Unknown) or failed."""
    run_ids = ctl.submit_many([("payment", {"id": f"q-{n}", "amount": n}) for n in range(50)])
    wanted = set(run_ids)

    def all_queued() -> bool:
        ctl.no_new_work("")  # collect what was dispatched
        return {item.run_id for item in ctl.pending} >= wanted

    ctl.drive(all_queued, "fifty work items dispatched")
    items = [item for item in ctl.pending if item.run_id in wanted]
    ctl.pending[:] = [item for item in ctl.pending if item.run_id not in wanted]
    for item in items:  # one worker, one item at a time: each takes a second
        ctl.report(item)
        ctl.advance_to(ctl.now + 1_000)
        ctl.result(item)
    states = [ctl.terminal(run_id) for run_id in run_ids]
    assert [s.status for s in states] == ["succeeded"] * 50
    for run_id in run_ids:
        assert not ctl.of(run_id, AttemptOutcomeUnknown) and not ctl.of(run_id, SegmentFailed)


def test_a_step_that_stops_heartbeating_is_lost_within_its_heartbeat_timeout(
    ctl: Control,
) -> None:
    run_id = ctl.submit("watched", {"n": 1})
    item = ctl.work(run_id)
    assert ctl.due(run_id)[0].kind == "schedule_to_start_timeout"
    started_at = ctl.now
    assert ctl.started(item) == started_at + STARTED_TIMEOUT_MS
    assert ctl.state(run_id).attempt.heartbeat_due_ms == started_at + HEARTBEAT_MS
    assert sorted(e.kind for e in ctl.due(run_id)) == ["attempt_timeout", "heartbeat_timeout"]

    ctl.advance_to(started_at + 1_200)  # past half the timeout: the heartbeat is recorded
    ctl.report(item, "heartbeat")
    (beat,) = ctl.wait_for(run_id, AttemptHeartbeatRecorded)
    assert beat.heartbeat_due_ms == ctl.now + HEARTBEAT_MS
    ctl.advance_to(ctl.now + 100)  # within half a timeout of it: absorbed, no fact
    ctl.report(item, "heartbeat")
    ctl.settle()
    assert len(ctl.of(run_id, AttemptHeartbeatRecorded)) == 1

    # The step stops heartbeating: it is lost at its heartbeat timeout, not its 60 s one.
    ctl.advance_to(beat.heartbeat_due_ms)
    (lost,) = ctl.wait_for(run_id, AttemptLost)
    assert (lost.cause, lost.losses, lost.generation) == ("heartbeat_timeout", 1, 1)
    assert lost.time_ms - beat.time_ms == HEARTBEAT_MS
    retry = ctl.work(run_id)
    assert (retry.generation, retry.attempt) == (2, 2)
    state = ctl.state(run_id)
    assert (state.infrastructure_losses, state.attempt.step_attempts) == (1, 1)
    shown = status_dict(state)  # what ``processor status`` prints
    assert (shown["infrastructure_losses"], shown["step_attempts"]) == (1, 1)
    assert [timer["kind"] for timer in shown["timers"]] == ["schedule_to_start_timeout"]

    # The crunch step allows one attempt only: the loss was not charged to it.
    ctl.complete(retry)
    done = ctl.terminal(run_id)
    assert (done.status, done.infrastructure_losses) == ("succeeded", 1)
    assert not ctl.of(run_id, SegmentFailed)


def test_stale_and_repeated_reports_change_nothing_and_are_not_rejected(ctl: Control) -> None:
    run_id = ctl.submit("watched", {"n": 2})
    first = ctl.work(run_id)
    ctl.started(first, worker="a")
    stale = [
        ctl.report(first, worker="a"),  # the same start report again
        ctl.report(first, "heartbeat", worker="b"),  # not the worker running it
        ctl.report(first, "heartbeat", step=1, worker="a"),  # a step it has not started
    ]
    ctl.advance_to(ctl.now + 1_500)
    ctl.report(first, "heartbeat", worker="a")  # decided after the others
    ctl.wait_for(run_id, AttemptHeartbeatRecorded)
    assert len(ctl.of(run_id, AttemptStepStarted)) == 1
    for record in stale:
        assert ctl.h.rejected.find(record) is None

    # Another worker starts it again (its item was redelivered): counted, timer re-armed.
    assert ctl.started(first, worker="b") == ctl.now + STARTED_TIMEOUT_MS
    again = ctl.of(run_id, AttemptStepStarted)[-1]
    assert again.redelivered and ctl.state(run_id).infrastructure_losses == 1
    ctl.complete(first)
    assert ctl.terminal(run_id).status == "succeeded"
    late = ctl.report(first, "heartbeat", worker="b")  # after the end: refused quietly
    ctl.settle()
    assert ctl.h.rejected.find(late) is None


def test_an_attempt_no_worker_starts_in_time_is_dispatched_again(ctl: Control) -> None:
    run_id = ctl.submit("watched", {"n": 3})
    queued = ctl.work(run_id)
    ctl.advance_to(ctl.now + START_MS)
    (lost,) = ctl.wait_for(run_id, AttemptLost)
    assert (lost.cause, lost.step) == ("schedule_to_start_timeout", 0)
    again = ctl.work(run_id)
    assert again.generation == queued.generation + 1
    ctl.complete(again)
    done = ctl.terminal(run_id)
    assert (done.status, done.infrastructure_losses) == ("succeeded", 1)


# --- compensators: the same rules ----------------------------------------------------------


def test_a_compensator_queued_longer_than_its_timeout_then_started_completes(
    ctl: Control,
) -> None:
    run_id = ctl.submit("booking", {"id": "cq-1", "reject": True})
    ctl.complete(ctl.work(run_id))  # three steps completed, then confirm refuses: unwind
    refund = ctl.work(run_id, "compensate")
    assert ctl.due(run_id) == []  # waiting for a worker: no timer
    ctl.advance_to(ctl.now + 10 * COMPENSATION_MS)  # queued ten times its timeout
    ctl.settle()
    assert ctl.of(run_id, AttemptOutcomeUnknown) == []

    started_at = ctl.now
    assert ctl.started(refund) == started_at + COMPENSATION_MS  # its timeout runs from now
    started = ctl.one(run_id, AttemptStepStarted)
    assert (started.kind, started.segment, started.step) == ("compensate", 1, 1)
    assert [e.kind for e in ctl.due(run_id)] == ["compensation_timeout"]
    ctl.advance_to(started_at + COMPENSATION_MS - 1)  # it takes almost all of it
    ctl.complete(refund)
    ctl.complete(ctl.work(run_id, "compensate"))  # then reserve's, never reported started
    state = ctl.terminal(run_id)
    assert (state.execution, state.recovery) == ("Failed", "PartiallyCompensated")
    assert [f.step for f in ctl.of(run_id, CompensationStepCompleted)] == [1, 0]
    assert ctl.of(run_id, AttemptOutcomeUnknown) == []


def test_a_started_compensator_that_stops_heartbeating_is_lost_within_its_heartbeat_timeout(
    ctl: Control,
) -> None:
    run_id = ctl.submit("undone", {"n": 1})
    ctl.complete(ctl.work(run_id))  # lease completed, settle refused: lease is unwound
    unlease = ctl.work(run_id, "compensate")
    assert [e.kind for e in ctl.due(run_id)] == ["schedule_to_start_timeout"]
    started_at = ctl.now
    assert ctl.started(unlease) == started_at + UNDO_MS
    assert ctl.state(run_id).compensation.heartbeat_due_ms == started_at + HEARTBEAT_MS
    assert sorted(e.kind for e in ctl.due(run_id)) == ["compensation_timeout", "heartbeat_timeout"]
    shown = status_dict(ctl.state(run_id))["started"]  # what ``processor status`` prints
    assert (shown["kind"], shown["step"], shown["expires_ms"]) == (
        "compensate",
        0,
        ctl.now + UNDO_MS,
    )

    ctl.advance_to(started_at + 1_200)  # past half the timeout: the heartbeat is recorded
    ctl.report(unlease, "heartbeat")
    (beat,) = ctl.wait_for(run_id, AttemptHeartbeatRecorded)
    assert (beat.kind, beat.heartbeat_due_ms) == ("compensate", ctl.now + HEARTBEAT_MS)

    # It stops heartbeating: lost at its heartbeat timeout, not its 60 s one, and, as it
    # may have undone part of the step, Unknown (not dispatched again blindly).
    ctl.advance_to(beat.heartbeat_due_ms)
    (unknown,) = ctl.wait_for(run_id, AttemptOutcomeUnknown)
    assert (unknown.kind, unknown.segment, unknown.generation) == ("compensate", 0, 1)
    assert unknown.time_ms - beat.time_ms == HEARTBEAT_MS
    assert ctl.state(run_id).phase == "unknown" and ctl.due(run_id) == []
    assert ctl.of(run_id, AttemptLost) == []
    ctl.complete(unlease)  # its late result settles it
    state = ctl.terminal(run_id)
    assert (state.execution, state.recovery) == ("Failed", "Compensated")


def test_a_compensator_no_worker_starts_in_time_is_dispatched_again(ctl: Control) -> None:
    run_id = ctl.submit("undone", {"n": 2})
    ctl.complete(ctl.work(run_id))
    queued = ctl.work(run_id, "compensate")
    ctl.advance_to(ctl.now + START_MS)
    (lost,) = ctl.wait_for(run_id, AttemptLost)
    assert (lost.kind, lost.cause, lost.step, lost.losses) == (
        "compensate",
        "schedule_to_start_timeout",
        0,
        1,
    )
    again = ctl.work(run_id, "compensate")  # the same attempt: its budget is not charged
    assert (again.attempt, again.generation) == (queued.attempt, queued.generation + 1)
    ctl.complete(again)
    state = ctl.terminal(run_id)
    assert (state.recovery, state.infrastructure_losses) == ("Compensated", 1)
    assert ctl.of(run_id, CompensationAttemptFailed) == []
