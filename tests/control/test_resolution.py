"""Unknown attempts and operator resolution through ResolveAttempt records on runs.commands."""

from __future__ import annotations

import json
import logging

import pytest

from processor.facts.models import (
    AttemptOutcomeUnknown,
    AttemptResolved,
    CompensationStepCompleted,
    RetryScheduled,
    RunFailed,
    RunStopped,
    RunStopRequested,
    RunSucceeded,
    SegmentAttemptStarted,
    SegmentFailed,
    StepCompleted,
    WorkItem,
)
from tests.apps.control_pipelines import PAYMENT_TIMEOUT_S
from tests.control.control_support import Control, timers_held

ORDER = {"id": "p-1", "amount": 25}


def lose_the_payment(ctl: Control, *, deadline_ms: int | None = None) -> tuple[str, WorkItem]:
    """Submit a payment and let its effectful attempt expire without a result."""
    run_id = ctl.submit("payment", ORDER, deadline_ms=deadline_ms)
    lost = ctl.work(run_id)
    expires_ms = ctl.started(lost)  # an effectful step: Unknown after its own timeout
    assert expires_ms == ctl.now + int(PAYMENT_TIMEOUT_S * 1000)
    ctl.advance_to(expires_ms)
    ctl.wait_for(run_id, AttemptOutcomeUnknown)
    return run_id, lost


def test_a_lost_effectful_attempt_becomes_unknown_and_is_never_retried(
    ctl: Control, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="processor.model.attempts")
    run_id, lost = lose_the_payment(ctl)
    unknown = ctl.one(run_id, AttemptOutcomeUnknown)
    assert (unknown.kind, unknown.segment, unknown.attempt, unknown.generation, unknown.step) == (
        "forward",
        lost.segment,
        lost.attempt,
        lost.generation,
        0,
    )
    state = ctl.state(run_id)
    assert state.phase == "unknown" and not state.terminal
    assert ctl.of(run_id, SegmentFailed) == [] and ctl.of(run_id, RetryScheduled) == []
    warnings = [r for r in caplog.records if "remote_outcome_unknown" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert run_id in warnings[0].getMessage()
    assert "automatic_retry_suppressed" in warnings[0].getMessage()

    ctl.advance_to(ctl.now + 3_600_000)  # an hour later: still waiting for an operator
    ctl.settle()
    assert ctl.types(run_id)[-1] == "AttemptOutcomeUnknown"
    assert ctl.due(run_id) == []
    assert ctl.no_new_work(run_id)
    assert len(ctl.of(run_id, SegmentAttemptStarted)) == 1


def test_a_supplied_success_completes_the_step_and_the_run_continues(ctl: Control) -> None:
    run_id, lost = lose_the_payment(ctl)
    supplied = {**ORDER, "authorized": 25, "by": "operator"}
    command, _ = ctl.resolve(run_id, "succeed", key="op-ok", output=supplied)
    reply = ctl.reply(command)
    assert (reply.created, reply.refusal) == (True, None)
    resolved = ctl.one(run_id, AttemptResolved)
    assert (resolved.action, resolved.generation, resolved.idempotency_key) == (
        "succeed",
        lost.generation,
        "op-ok",
    )
    assert json.loads(ctl.one(run_id, StepCompleted).output) == supplied
    following = ctl.work(run_id)
    assert (following.first_step, following.generation) == (1, lost.generation + 1)
    ctl.complete(following)
    state = ctl.terminal(run_id)
    assert json.loads(state.result or b"") == {"shipped": supplied}
    assert (state.execution, state.recovery) == ("Completed", "NotRequired")


def test_a_declared_failure_fails_the_run_and_the_unsettled_step_is_not_compensated(
    ctl: Control,
) -> None:
    run_id, _ = lose_the_payment(ctl)
    command, _ = ctl.resolve(run_id, "fail", key="op-fail", error="the bank declined it")
    assert ctl.reply(command).created is True
    state = ctl.terminal(run_id)
    failed = ctl.one(run_id, RunFailed)
    assert (failed.error, failed.error_type, failed.recovery) == (
        "the bank declined it",
        "DeclaredFailure",
        "NotRequired",  # the declared-failed step never completed: nothing to undo
    )
    assert (state.execution, state.recovery) == ("Failed", "NotRequired")
    assert ctl.of(run_id, SegmentFailed)[0].retryable is False
    assert ctl.no_new_work(run_id)


def test_an_explicit_retry_creates_the_next_generation_and_fences_the_old_one(
    ctl: Control,
) -> None:
    run_id, lost = lose_the_payment(ctl)
    command, _ = ctl.resolve(run_id, "retry", key="op-retry")
    assert ctl.reply(command).created is True
    retried = ctl.work(run_id)
    assert (retried.segment, retried.attempt, retried.first_step) == (1, lost.attempt, 0)
    assert retried.generation == lost.generation + 1

    _, old = ctl.result(lost)  # generation G answers at last: it can never commit
    assert ctl.rejection(old).reason == "stale_attempt"
    assert ctl.of(run_id, StepCompleted) == []

    ctl.complete(retried)
    state = ctl.terminal(run_id)
    assert state.status == "succeeded"
    assert {f.generation for f in ctl.of(run_id, StepCompleted)} == {retried.generation}


def test_an_identical_repeat_returns_the_recorded_response(ctl: Control) -> None:
    run_id, _ = lose_the_payment(ctl)
    first, _ = ctl.resolve(run_id, "succeed", key="op-1", output={"authorized": 1})
    recorded = ctl.reply(first)
    assert recorded.created is True and recorded.response
    count = ctl.facts_count(run_id)

    unknown = ctl.one(run_id, AttemptOutcomeUnknown)
    repeat, _ = ctl.resolve(
        run_id, "succeed", key="op-1", output={"authorized": 1}, generation=unknown.generation
    )
    replayed = ctl.reply(repeat)
    assert (replayed.created, replayed.refusal) == (False, None)
    assert replayed.response == recorded.response
    assert ctl.facts_count(run_id) == count

    ctl.complete(ctl.work(run_id))
    ctl.terminal(run_id)  # even after the run finished, the key replays its response
    late, _ = ctl.resolve(
        run_id, "succeed", key="op-1", output={"authorized": 1}, generation=unknown.generation
    )
    assert ctl.reply(late).response == recorded.response
    assert len(ctl.of(run_id, AttemptResolved)) == 1


def test_the_same_key_with_another_command_is_an_idempotency_conflict(ctl: Control) -> None:
    run_id, lost = lose_the_payment(ctl)
    first, _ = ctl.resolve(run_id, "retry", key="op-2")
    assert ctl.reply(first).created is True
    count = ctl.facts_count(run_id)

    other, record = ctl.resolve(
        run_id, "fail", key="op-2", error="changed my mind", generation=lost.generation
    )
    assert ctl.reply(other).refusal == "idempotency_conflict"
    assert ctl.rejection(record).reason == "idempotency_conflict"
    assert ctl.facts_count(run_id) == count


def test_a_stale_generation_is_refused(ctl: Control) -> None:
    run_id, lost = lose_the_payment(ctl)
    ahead, record = ctl.resolve(run_id, "retry", key="op-ahead", generation=lost.generation + 1)
    assert ctl.reply(ahead).refusal == "stale_attempt"
    assert ctl.rejection(record).reason == "stale_attempt"
    assert ctl.of(run_id, AttemptResolved) == []

    retry, _ = ctl.resolve(run_id, "retry", key="op-3")
    assert ctl.reply(retry).created is True
    count = ctl.facts_count(run_id)
    settled, record = ctl.resolve(  # G was settled by the retry: stale under a fresh key
        run_id, "succeed", key="op-4", output={"authorized": 1}, generation=lost.generation
    )
    assert ctl.reply(settled).refusal == "stale_attempt"
    assert ctl.rejection(record).reason == "stale_attempt"
    assert ctl.facts_count(run_id) == count


def refuse_a_late_retry(ctl: Control, run_id: str) -> None:
    count = ctl.facts_count(run_id)
    command, record = ctl.resolve(run_id, "retry", key="op-late")
    assert ctl.reply(command).refusal == "deadline_elapsed"
    assert ctl.rejection(record).reason == "deadline_elapsed"
    assert ctl.facts_count(run_id) == count  # nothing mutated


@pytest.mark.parametrize("timer", ["not_fired", "fired"])
def test_an_explicit_retry_after_the_deadline_is_refused_as_deadline_elapsed(
    ctl: Control, timer: str
) -> None:
    deadline = ctl.now + 60_000
    run_id, _ = lose_the_payment(ctl, deadline_ms=deadline)
    if timer == "fired":  # the deadline's stop intent already committed
        ctl.advance_to(deadline)
        ctl.wait_for(run_id, RunStopRequested)
        refuse_a_late_retry(ctl, run_id)
    else:  # the clock passed the deadline, the timer has not fired: the same refusal
        with timers_held(ctl.h):
            ctl.advance_to(deadline)
            refuse_a_late_retry(ctl, run_id)
            assert ctl.of(run_id, RunStopRequested) == []  # not even the stop was committed
    assert ctl.of(run_id, AttemptResolved) == []
    assert ctl.no_new_work(run_id)

    supplied, _ = ctl.resolve(run_id, "succeed", key="op-ok", output={"authorized": 25})
    assert ctl.reply(supplied).created is True  # a supplied success still settles
    assert ctl.one(run_id, RunStopRequested).reason == "timed_out"
    void = ctl.work(run_id, "compensate")  # and the supplied step joins the unwind
    assert void.first_step == 0
    ctl.complete(void)
    state = ctl.terminal(run_id)
    assert (state.execution, state.recovery) == ("TimedOut", "Compensated")
    assert [f.step for f in ctl.of(run_id, CompensationStepCompleted)] == [0]


def test_an_explicit_retry_after_a_cancel_is_refused_as_retry_forbidden(ctl: Control) -> None:
    deadline = ctl.now + 60_000
    run_id, _ = lose_the_payment(ctl, deadline_ms=deadline)
    cancel, _ = ctl.cancel(run_id)
    assert ctl.reply(cancel).created is True
    assert ctl.state(run_id).phase == "unknown"  # stopping, but the Unknown attempt remains

    command, record = ctl.resolve(run_id, "retry", key="op-r1")
    assert ctl.reply(command).refusal == "retry_forbidden"
    ctl.advance_to(deadline + 1)  # a cancelled run keeps its reason after the deadline
    ctl.settle()
    command, record = ctl.resolve(run_id, "retry", key="op-r2")
    assert ctl.reply(command).refusal == "retry_forbidden"
    assert ctl.rejection(record).reason == "retry_forbidden"
    assert ctl.of(run_id, AttemptResolved) == []

    declared, _ = ctl.resolve(run_id, "fail", key="op-f", error="never charged")
    assert ctl.reply(declared).created is True
    state = ctl.terminal(run_id)
    assert (state.execution, state.recovery) == ("Cancelled", "NotRequired")
    assert ctl.one(run_id, RunStopped).execution == "Cancelled"
    assert ctl.of(run_id, RunSucceeded) == []
