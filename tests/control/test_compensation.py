"""Compensation: reverse completion order, one at a time, own retry policy, skips, outcomes."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from processor.clients.client import status_dict
from processor.facts.models import (
    BoundaryCompletion,
    CompensationAttemptFailed,
    CompensationAttemptStarted,
    CompensationStarted,
    CompensationStepCompleted,
    CompensationStepSkipped,
    FactHeader,
    RunFailed,
    RunStopped,
    RunStopRequested,
    RunSucceeded,
)
from processor.facts.topics import TopicName
from tests.apps.control_pipelines import COMPENSATION_RETRY, FORWARD_RETRY
from tests.control.control_support import Control


def test_compensators_run_one_at_a_time_in_reverse_completion_order(ctl: Control) -> None:
    run_id = ctl.submit("booking", {"id": "k-1", "reject": True})
    ctl.complete(ctl.work(run_id))  # reserve, charge, notify completed; confirm refused
    assert ctl.one(run_id, RunStopRequested).reason == "failed"
    assert ctl.one(run_id, CompensationStarted).steps == (2, 1, 0)

    undone = []
    for _ in range(2):
        item = ctl.work(run_id, "compensate")
        ctl.settle()  # while one compensator runs, the next is not dispatched
        assert ctl.no_new_work(run_id)
        assert ctl.state(run_id).compensation.step == item.first_step
        ctl.complete(item)
        undone.append(item.first_step)
    assert undone == [1, 0]
    state = ctl.terminal(run_id)
    assert (state.execution, state.recovery) == ("Failed", "PartiallyCompensated")

    types = ctl.types(run_id)
    unwind = types[types.index("CompensationStarted") :]
    assert unwind == [
        "CompensationStarted",
        "CompensationStepSkipped",  # notify: no compensator
        "CompensationAttemptStarted",  # charge
        "CompensationStepCompleted",
        "CompensationAttemptStarted",  # reserve, only after charge was undone
        "CompensationStepCompleted",
        "RunFailed",
    ]
    assert [f.step for f in ctl.of(run_id, CompensationAttemptStarted)] == [1, 0]
    assert [f.step for f in ctl.of(run_id, CompensationStepCompleted)] == [1, 0]


def test_a_step_without_compensator_is_recorded_as_a_skip(ctl: Control) -> None:
    run_id = ctl.submit("approval", {"n": 5})
    request = ctl.until_suspended(run_id)
    ctl.consumed(ctl.complete_interaction(request, {"ok": 5}))
    finish = ctl.work(run_id)  # the continuation is running
    command, _ = ctl.cancel(run_id)
    assert ctl.reply(command).created is True
    ctl.complete(finish)  # finish completed while cancelling: three completed steps

    skipped = ctl.of(run_id, CompensationStepSkipped)
    assert [(f.step, f.reason, f.fact_key) for f in skipped] == [
        (2, "no_compensator", "compensate/2/done"),  # finish_approval
        (1, "no_compensator", "compensate/1/done"),  # the await step
    ]
    item = ctl.work(run_id, "compensate")
    assert item.first_step == 0  # no work was dispatched for the skipped steps
    assert json.loads(item.input) == {"n": 5, "held": True}  # the step's own output
    ctl.complete(item)
    state = ctl.terminal(run_id)
    assert (state.execution, state.recovery) == ("Cancelled", "PartiallyCompensated")
    assert (state.compensation.compensated, state.compensation.skipped) == (1, 2)


def test_a_compensator_retries_by_its_own_policy_and_a_permanent_failure_stops_the_unwind(
    ctl: Control,
) -> None:
    assert COMPENSATION_RETRY.max_attempts != FORWARD_RETRY.max_attempts
    run_id = ctl.submit("booking", {"id": "k-3", "reject": True, "refund_fails": True})
    ctl.complete(ctl.work(run_id))
    backoffs = []
    for attempt in range(1, COMPENSATION_RETRY.max_attempts + 1):
        item = ctl.work(run_id, "compensate")
        assert (item.first_step, item.attempt, item.generation) == (1, attempt, attempt)
        started = ctl.now
        ctl.complete(item)  # the refund fails, retryably
        failed = ctl.of(run_id, CompensationAttemptFailed)[-1]
        assert (failed.step, failed.attempt, failed.error_type) == (1, attempt, "TransientError")
        if failed.retry_due_ms is None:
            break
        backoffs.append(failed.retry_due_ms - started)
        ctl.advance_to(failed.retry_due_ms - 1)
        ctl.settle()
        assert ctl.no_new_work(run_id)  # not before its backoff
        ctl.advance_to(failed.retry_due_ms)
    assert backoffs == [COMPENSATION_RETRY.backoff_ms(n) for n in (1, 2)]
    assert len(ctl.of(run_id, CompensationAttemptFailed)) == COMPENSATION_RETRY.max_attempts

    state = ctl.terminal(run_id)
    assert (state.execution, state.recovery) == ("Failed", "CompensationFailed")
    assert state.compensation.failed
    assert ctl.of(run_id, CompensationStepCompleted) == []
    assert {f.step for f in ctl.of(run_id, CompensationAttemptStarted)} == {1}  # reserve never
    assert ctl.no_new_work(run_id)


def _succeeded(ctl: Control) -> str:
    run_id = ctl.submit("booking", {"id": "o-1"})
    ctl.play(run_id)
    return run_id


def _failed_and_compensated(ctl: Control) -> str:
    run_id = ctl.submit("approval", {"n": 8})
    request = ctl.until_suspended(run_id)
    refusal = BoundaryCompletion(
        token=request.resume_token, idempotency_key="no", outcome="failure", error="denied"
    )
    ctl.h.produce_model(TopicName.COMPLETIONS, run_id, refusal)
    ctl.play(run_id)
    return run_id


def _cancelled_and_compensated(ctl: Control) -> str:
    run_id = ctl.submit("approval", {"n": 9})
    ctl.until_suspended(run_id)
    ctl.cancel(run_id)
    ctl.play(run_id)
    return run_id


def _timed_out_with_nothing_to_undo(ctl: Control) -> str:
    run_id = ctl.submit("timed", {"id": "o-4", "transient": True})
    ctl.complete(ctl.work(run_id))  # a retry is queued when the deadline passes
    deadline = ctl.state(run_id).deadline_ms
    assert deadline is not None
    ctl.advance_to(deadline)
    ctl.terminal(run_id)
    return run_id


SCENARIOS: dict[str, tuple[Callable[[Control], str], str, str, str, type[FactHeader]]] = {
    "succeeded": (_succeeded, "succeeded", "Completed", "NotRequired", RunSucceeded),
    "failed": (_failed_and_compensated, "failed", "Failed", "Compensated", RunFailed),
    "cancelled": (_cancelled_and_compensated, "cancelled", "Cancelled", "Compensated", RunStopped),
    "timed_out": (
        _timed_out_with_nothing_to_undo,
        "timed_out",
        "TimedOut",
        "NotRequired",
        RunStopped,
    ),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_the_terminal_record_keeps_execution_and_recovery(ctl: Control, scenario: str) -> None:
    drive, status, execution, recovery, terminal_type = SCENARIOS[scenario]
    run_id = drive(ctl)
    facts = ctl.facts(run_id)
    assert type(facts[-1]) is terminal_type
    assert sum(f.fact_key == "terminal" for f in facts) == 1
    terminal = facts[-1]
    if isinstance(terminal, RunStopped):
        assert (terminal.execution, terminal.recovery) == (execution, recovery)
    elif isinstance(terminal, RunFailed):
        assert terminal.recovery == recovery

    state = ctl.state(run_id)
    assert (state.status, state.execution, state.recovery) == (status, execution, recovery)
    client = ctl.client()
    try:
        seen = client.stored_status(run_id)  # what `processor status` reads: the same projection
    finally:
        client.close()
    assert seen == state
    shown = status_dict(state)
    assert (shown["status"], shown["execution"], shown["recovery"]) == (
        status,
        execution,
        recovery,
    )
    assert json.loads(json.dumps(shown, default=str))["execution"] == execution
