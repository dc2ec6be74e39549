"""Races: each input against the deadline, cancel against timeout, late result against operator.

Two records produced before one ``run_once`` have no order on Kafka across topics,
so each ordered case drives until the first input is decided (or holds the timer
scan) before the second exists; the concurrent case asserts what holds either way.
"""

from __future__ import annotations

import json

import pytest

from processor.facts.models import (
    AttemptOutcomeUnknown,
    AttemptResolved,
    BoundaryCompletionAdmitted,
    BoundaryInteractionDispatched,
    CompensationStepCompleted,
    CompensationStepSkipped,
    InteractionTimedOut,
    RunStopped,
    RunStopRequested,
    SegmentCompleted,
    SegmentSuspended,
    StepCompleted,
)
from processor.facts.topics import TopicName
from tests.control.control_support import Control, timers_held


def _deadline(ctl: Control, run_id: str) -> int:
    deadline = ctl.state(run_id).deadline_ms
    assert deadline is not None
    return deadline


def _finish_unwind(ctl: Control, run_id: str, steps: list[int]) -> tuple[str, str]:
    """Play the compensators of ``steps`` in order; return the terminal outcomes."""
    for step in steps:
        item = ctl.work(run_id, "compensate")
        assert item.first_step == step
        ctl.complete(item)
    state = ctl.terminal(run_id)
    assert [f.step for f in ctl.of(run_id, CompensationStepCompleted)] == steps
    assert state.execution is not None and state.recovery is not None
    return state.execution, state.recovery


@pytest.mark.parametrize("order", ["result_first", "timer_first"])
def test_a_result_at_the_deadline_settles_under_the_timeout_in_either_order(
    ctl: Control, order: str
) -> None:
    run_id = ctl.submit("timed", {"id": f"r-{order}"})
    item = ctl.work(run_id)
    deadline = _deadline(ctl, run_id)
    if order == "result_first":
        with timers_held(ctl.h):
            result, record = ctl.result(item)
            ctl.advance_to(deadline)
            ctl.consumed(record)
        assert ctl.one(run_id, RunStopRequested).cause_id == result.result_id
    else:
        ctl.advance_to(deadline)
        stop = ctl.wait_for(run_id, RunStopRequested)[0]
        assert stop.cause_id.startswith("timer/run_deadline/")
        ctl.complete(item)
    assert ctl.one(run_id, RunStopRequested).reason == "timed_out"
    # The attempt's success is kept (`hold` completed), but it does not suspend the run.
    assert [f.step for f in ctl.of(run_id, StepCompleted)] == [0]
    assert ctl.one(run_id, SegmentCompleted).last_step == 0
    assert ctl.of(run_id, SegmentSuspended) == []
    assert ctl.of(run_id, BoundaryInteractionDispatched) == []
    assert _finish_unwind(ctl, run_id, [0]) == ("TimedOut", "Compensated")
    assert ctl.requests_of(run_id) == []


@pytest.mark.parametrize("order", ["completion_first", "timer_first", "completion_just_before"])
def test_a_completion_at_the_deadline_loses_in_either_order(ctl: Control, order: str) -> None:
    run_id = ctl.submit("timed", {"id": f"a-{order}"})
    request = ctl.until_suspended(run_id)
    deadline = _deadline(ctl, run_id)
    assert request.deadline_ms > deadline  # the run deadline comes first
    if order == "completion_just_before":
        ctl.advance_to(deadline - 1)
        ctl.consumed(ctl.complete_interaction(request, {"approved": True}))
        assert len(ctl.of(run_id, BoundaryCompletionAdmitted)) == 1
        finish = ctl.work(run_id)
        ctl.advance_to(deadline)  # the continuation is still running at the deadline
        ctl.wait_for(run_id, RunStopRequested)
        ctl.complete(finish)
        assert ctl.one(run_id, RunStopRequested).reason == "timed_out"
        assert [f.step for f in ctl.of(run_id, CompensationStepSkipped)] == [2, 1]
        assert _finish_unwind(ctl, run_id, [0]) == ("TimedOut", "PartiallyCompensated")
        return
    if order == "completion_first":
        with timers_held(ctl.h):
            record = ctl.complete_interaction(request, {"approved": True})
            ctl.advance_to(deadline)
            refused = ctl.rejection(record)
        cause = f"{record.topic}/{record.partition}/{record.offset}"
        assert ctl.one(run_id, RunStopRequested).cause_id == cause
    else:
        ctl.advance_to(deadline)
        ctl.wait_for(run_id, RunStopRequested)
        record = ctl.complete_interaction(request, {"approved": True})
        refused = ctl.rejection(record)
    assert record.topic == ctl.h.name(TopicName.COMPLETIONS)
    assert refused.reason == "run_terminal"
    assert ctl.one(run_id, RunStopRequested).reason == "timed_out"
    assert ctl.of(run_id, BoundaryCompletionAdmitted) == []
    assert ctl.of(run_id, InteractionTimedOut) == []  # fenced by the stop, not timed out
    assert _finish_unwind(ctl, run_id, [0]) == ("TimedOut", "Compensated")


@pytest.mark.parametrize("order", ["cancel_first", "deadline_first", "cancel_at_the_deadline"])
def test_cancel_against_the_deadline_the_first_committed_stop_wins(
    ctl: Control, order: str
) -> None:
    run_id = ctl.submit("timed", {"id": f"x-{order}"})
    ctl.until_suspended(run_id)
    deadline = _deadline(ctl, run_id)
    if order == "cancel_first":
        command, _ = ctl.cancel(run_id)
        reply = ctl.reply(command)
        assert (reply.created, reply.refusal) == (True, None)
        ctl.advance_to(deadline)
        ctl.settle()
        expected = "Cancelled"
    elif order == "deadline_first":
        ctl.advance_to(deadline)
        ctl.wait_for(run_id, RunStopRequested)
        command, _ = ctl.cancel(run_id)
        reply = ctl.reply(command)
        assert (reply.created, reply.refusal) == (False, None)
        assert "already stopping: timed_out" in (reply.detail or "")
        expected = "TimedOut"
    else:  # the cancel is decided at the deadline, before the timer: the deadline still wins
        with timers_held(ctl.h):
            ctl.advance_to(deadline)
            command, _ = ctl.cancel(run_id)
            reply = ctl.reply(command)
        assert reply.created is False and "timed_out" in (reply.detail or "")
        assert ctl.one(run_id, RunStopRequested).cause_id == command.command_id
        expected = "TimedOut"
    stops = ctl.of(run_id, RunStopRequested)
    assert len(stops) == 1
    assert stops[0].reason == {"Cancelled": "cancelled", "TimedOut": "timed_out"}[expected]
    assert _finish_unwind(ctl, run_id, [0]) == (expected, "Compensated")
    assert ctl.one(run_id, RunStopped).execution == expected


@pytest.mark.parametrize("order", ["worker_first", "operator_first", "concurrently"])
def test_a_late_worker_result_and_an_operator_resolution_exactly_one_commits(
    ctl: Control, order: str
) -> None:
    run_id = ctl.submit("payment", {"id": f"l-{order}", "amount": 7})
    lost = ctl.work(run_id)
    ctl.advance_to(ctl.started(lost))
    ctl.wait_for(run_id, AttemptOutcomeUnknown)
    supplied = {"id": f"l-{order}", "authorized": 7, "by": "operator"}
    if order == "worker_first":
        ctl.complete(lost)
        command, record = ctl.resolve(
            run_id, "succeed", key="op", output=supplied, generation=lost.generation
        )
        assert ctl.reply(command).refusal == "stale_attempt"
        assert ctl.rejection(record).reason == "stale_attempt"
    elif order == "operator_first":
        command, _ = ctl.resolve(run_id, "succeed", key="op", output=supplied)
        assert ctl.reply(command).created is True
        _, late = ctl.result(lost)
        assert ctl.rejection(late).reason == "stale_attempt"
    else:  # both in flight at once; on Kafka either may be decided first
        command, _ = ctl.resolve(run_id, "succeed", key="op", output=supplied)
        _, late = ctl.result(lost)
        reply = ctl.reply(command)
        ctl.drive(
            lambda: ctl.of(run_id, StepCompleted) or ctl.h.rejected.find(late), "the late result"
        )
        operator_won = reply.created
        assert (reply.refusal is None) == operator_won
        if operator_won:
            assert ctl.rejection(late).reason == "stale_attempt"
        else:
            assert reply.refusal == "stale_attempt"
    ctl.play(run_id)
    state = ctl.terminal(run_id)
    assert state.status == "succeeded"
    step0 = [f for f in ctl.of(run_id, StepCompleted) if f.step == 0]
    assert len(step0) == 1  # exactly one settlement of generation G
    resolved = ctl.of(run_id, AttemptResolved)
    worker_output = {"id": f"l-{order}", "amount": 7, "authorized": 7}
    if resolved:
        assert len(resolved) == 1 and order != "worker_first"
        assert json.loads(step0[0].output) == supplied
        assert json.loads(state.result or b"") == {"shipped": supplied}
    else:
        assert order != "operator_first"
        assert json.loads(step0[0].output) == worker_output
        assert json.loads(state.result or b"") == {"shipped": worker_output}
