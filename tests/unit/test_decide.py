"""The run lifecycle decisions, one rule per test."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.clients.client import new_submit
from processor.errors import AppendConflictError
from processor.facts.models import (
    CommandReply,
    DeadLetter,
    RetryScheduled,
    RunFailed,
    RunOutcome,
    RunSubmitted,
    RunSucceeded,
    SegmentAttemptStarted,
    SegmentFailed,
    StepCompleted,
    SubmitRun,
    WorkItem,
)
from processor.facts.topics import TopicName
from processor.model.decide import Context, TimerFired, decide_submit, decide_timer
from processor.model.due import due_entries
from processor.model.journal import plan_append
from processor.model.pipeline_spec import RetryPolicy
from tests.unit.simulation import CATALOG, SPEC, Simulation


def types(facts: object) -> list[str]:
    return [type(f).__name__ for f in facts]  # type: ignore[attr-defined]


def test_submit_creates_the_run_and_dispatches_its_first_attempt() -> None:
    command = new_submit("sim", {"x": 1}, now_ms=5)
    decision = decide_submit(command, None, Context(CATALOG, now=10))
    assert types(decision.facts) == ["RunSubmitted", "SegmentAttemptStarted"]
    submitted, started = decision.facts
    assert isinstance(submitted, RunSubmitted) and isinstance(started, SegmentAttemptStarted)
    assert (submitted.seq, started.seq) == (1, 2)
    assert submitted.cause_id == command.command_id and submitted.pipeline_version == 1
    assert started.expires_ms is None  # no timer until a worker reports the start
    work = [e.value for e in decision.emits if e.topic is TopicName.WORK]
    assert len(work) == 1 and isinstance(work[0], WorkItem) and work[0].input == b'{"x":1}'
    replies = [e.value for e in decision.emits if e.topic is TopicName.REPLIES]
    assert replies == [
        CommandReply(command_id=command.command_id, run_id=command.run_id, created=True)
    ]


def test_keyed_submit_with_the_same_fields_returns_the_original_run() -> None:
    sim = Simulation()
    run_id = sim.submit("order-7", value=1)
    again = new_submit("sim", {"v": 1}, "order-7")
    decision = decide_submit(again, sim.states[run_id], Context(CATALOG, sim.now))
    assert decision.facts == () and decision.refusal is None
    reply = decision.emits[0].value
    assert isinstance(reply, CommandReply) and reply.run_id == run_id and reply.created is False


def test_keyed_submit_with_different_fields_is_an_idempotency_conflict() -> None:
    sim = Simulation()
    run_id = sim.submit("order-7", value=1)
    before = sim.states[run_id]
    decision = decide_submit(
        new_submit("sim", {"v": 2}, "order-7"), before, Context(CATALOG, sim.now)
    )
    assert decision.refusal == "idempotency_conflict" and decision.facts == ()
    reply = decision.emits[0].value
    assert isinstance(reply, CommandReply) and reply.refusal == "idempotency_conflict"
    assert sim.states[run_id] == before


def test_unkeyed_submits_are_always_new_runs() -> None:
    sim = Simulation()
    assert len({sim.submit(None, value=1) for _ in range(5)}) == 5


def test_the_same_unkeyed_command_delivered_twice_creates_one_run() -> None:
    command = new_submit("sim", {"v": 1})
    sim = Simulation()
    first = decide_submit(command, None, Context(CATALOG, sim.now))
    sim._take(first)
    second = decide_submit(command, sim.states[command.run_id], Context(CATALOG, sim.now))
    assert second.facts == () and second.refusal is None


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        (new_submit("nope", {}), "unknown_pipeline"),
        (new_submit("sim", {}).model_copy(update={"input": b"{not json"}), "invalid_input"),
        (new_submit("sim", {}, "k").model_copy(update={"run_id": "other"}), "invalid_command"),
        # Found by the fuzzer: a deadline no timer can hold (the due index keys it on 8
        # unsigned bytes, a fact carries an Avro long) crashed the loop after the commit.
        (new_submit("sim", {}).model_copy(update={"deadline_ms": -1}), "invalid_command"),
        (
            new_submit("sim", {}).model_copy(update={"deadline_after_ms": 2**63 - 1}),
            "invalid_command",
        ),
        (
            new_submit("sim", {}, now_ms=0).model_copy(update={"deadline_after_ms": -1}),
            "invalid_command",
        ),
    ],
)
def test_bad_submits_are_refused_without_facts(command: object, reason: str) -> None:
    decision = decide_submit(command, None, Context(CATALOG, 1))
    assert decision.refusal == reason and decision.facts == ()


def test_a_result_for_another_generation_is_stale_and_changes_nothing() -> None:
    sim = Simulation()
    run_id = sim.submit()
    sim.result(run_id, fail=True)  # generation 1 fails, retry scheduled
    sim.advance(1_000)  # generation 2 dispatched
    state = sim.states[run_id]
    assert state.attempt.generation == 2
    earlier = state.attempt.model_copy(update={"generation": 1, "number": 1})
    stale = state.model_copy(update={"attempt": earlier})
    from processor.facts.models import SegmentResult
    from processor.model.decide import decide_result

    result = SegmentResult(
        result_id="late",
        run_id=run_id,
        segment=1,
        attempt=stale.attempt.number,
        generation=stale.attempt.generation,
        steps=(),
        outcome="failed",
        failed_step=0,
        error="late",
        error_type="E",
        worker_id="w",
    )
    decision = decide_result(result, state, Context(CATALOG, sim.now))
    assert decision.refusal == "stale_attempt" and decision.facts == ()


def test_completed_steps_are_kept_and_the_retry_resumes_at_the_failed_step() -> None:
    sim = Simulation()
    run_id = sim.submit()
    decision = sim.result(run_id, fail=True, progress=1)
    assert types(decision.facts) == ["StepCompleted", "SegmentFailed", "RetryScheduled"]
    retry = decision.facts[-1]
    assert isinstance(retry, RetryScheduled)
    policy = SPEC.steps[1].retry
    assert retry.due_ms == sim.now + policy.backoff_ms(1)
    sim.advance(policy.backoff_ms(1))
    state = sim.states[run_id]
    assert (
        state.phase,
        state.attempt.generation,
        state.attempt.number,
        state.attempt.next_step,
    ) == (
        "dispatched",
        2,
        2,
        1,
    )
    started = sim.facts[-1]
    assert isinstance(started, SegmentAttemptStarted) and started.first_step == 1
    sim.result(run_id, fail=False)
    assert sim.states[run_id].status == "succeeded"
    steps = [f.step for f in sim.facts if isinstance(f, StepCompleted)]
    assert steps == [0, 1, 2]  # step 0 ran once


def test_a_retry_timer_before_its_due_time_does_nothing() -> None:
    sim = Simulation()
    run_id = sim.submit()
    sim.result(run_id, fail=True)
    (entry,) = due_entries(sim.states[run_id])
    assert (
        decide_timer(
            TimerFired(entry), sim.states[run_id], Context(CATALOG, entry.due_ms - 1)
        ).facts
        == ()
    )
    assert (
        decide_timer(TimerFired(entry), sim.states[run_id], Context(CATALOG, entry.due_ms)).facts
        != ()
    )


def test_exhausted_retries_fail_the_run_and_dead_letter_it() -> None:
    sim = Simulation()
    run_id = sim.submit()
    for _ in range(SPEC.steps[0].retry.max_attempts - 1):
        sim.result(run_id, fail=True)
        sim.advance(1_000)
    decision = sim.result(run_id, fail=True)
    assert types(decision.facts) == ["SegmentFailed", "RunFailed"]
    failed = decision.facts[-1]
    assert isinstance(failed, RunFailed) and failed.attempts == 3 and failed.error == "boom"
    dead = [e.value for e in decision.emits if e.topic is TopicName.DLQ]
    assert len(dead) == 1 and isinstance(dead[0], DeadLetter) and dead[0].attempts == 3
    outcomes = [e.value for e in decision.emits if e.topic is TopicName.OUTCOMES]
    assert isinstance(outcomes[0], RunOutcome) and outcomes[0].status == "failed"
    assert sim.states[run_id].status == "failed" and due_entries(sim.states[run_id]) == frozenset()


def test_a_non_retryable_failure_fails_at_once() -> None:
    sim = Simulation()
    run_id = sim.submit()
    decision = sim.result(run_id, fail=True, retryable=False)
    assert types(decision.facts) == ["SegmentFailed", "RunFailed"]


def test_an_attempt_past_its_timeout_is_lost_and_retried() -> None:
    sim = Simulation()
    run_id = sim.submit()
    assert sim.states[run_id].attempt.expires_ms is None  # queued: no timer
    sim.advance(60_000)
    assert sim.states[run_id].phase == "dispatched"
    sim.progress(run_id)  # a worker starts step 0: the timer runs from now
    expires = sim.states[run_id].attempt.expires_ms
    assert expires == sim.now + SPEC.segment_timeout_ms(0)
    sim.advance(expires - sim.now)
    failed = [f for f in sim.facts if isinstance(f, SegmentFailed)]
    assert len(failed) == 1 and failed[0].error_type == "attempt_timeout"
    assert sim.states[run_id].phase == "retry_wait"
    sim.advance(1_000)
    assert sim.states[run_id].attempt.generation == 2 and sim.states[run_id].phase == "dispatched"


def test_success_records_the_last_output_as_the_result() -> None:
    sim = Simulation()
    run_id = sim.submit()
    decision = sim.result(run_id, fail=False)
    done = decision.facts[-1]
    assert isinstance(done, RunSucceeded) and done.result == b'{"s":2,"n":1}'
    assert sim.states[run_id].result == done.result


def test_conditional_append_dedupes_by_key_and_refuses_stale_versions() -> None:
    sim = Simulation()
    run_id = sim.submit()
    facts = [f for f in sim.facts if f.run_id == run_id]
    existing = {f.fact_key for f in facts}
    assert plan_append(facts, 0, 2, existing.__contains__) == []  # a retried append: no-op
    new = facts[-1].model_copy(update={"fact_key": "new", "seq": 3})
    assert plan_append([new], 2, 2, existing.__contains__) == [new]
    with pytest.raises(AppendConflictError):
        plan_append([new], 1, 2, existing.__contains__)
    renumbered = plan_append(
        [facts[0], new.model_copy(update={"seq": 9})], 2, 2, existing.__contains__
    )
    assert [f.seq for f in renumbered] == [3]


@given(
    st.integers(1, 10),
    st.integers(0, 10_000),
    st.floats(1, 4),
    st.integers(0, 60_000),
    st.integers(1, 12),
)
def test_backoff_is_deterministic_capped_and_non_decreasing(
    attempts: int, initial: int, multiplier: float, cap: int, made: int
) -> None:
    policy = RetryPolicy(attempts, initial, multiplier, cap)
    assert policy.backoff_ms(made) == policy.backoff_ms(made)
    assert 0 <= policy.backoff_ms(made) <= cap
    assert policy.backoff_ms(made + 1) >= policy.backoff_ms(made)
    assert policy.allows_another(made) == (made < attempts)


def test_a_keyed_retry_with_the_same_relative_deadline_returns_the_original_run() -> None:
    """``submit --deadline-s`` sends the deadline relative to the submit: a retry made
    later is the same submit, and the first one fixed the run's absolute deadline."""
    from processor.model.reduce import fold

    def keyed(now_ms: int, after_ms: int) -> SubmitRun:
        command = new_submit("sim", {"v": 1}, "order-9", now_ms=now_ms)
        return command.model_copy(update={"deadline_after_ms": after_ms})

    first = keyed(1_000, 600_000)
    created = decide_submit(first, None, Context(CATALOG, now=1_010))
    state = fold(list(created.facts), None)
    assert state is not None and state.deadline_ms == 601_000

    retry = keyed(5_000, 600_000)
    again = decide_submit(retry, state, Context(CATALOG, now=5_010))
    assert again.refusal is None and again.facts == ()
    reply = again.emits[0].value
    assert isinstance(reply, CommandReply) and reply.created is False

    other = decide_submit(keyed(5_000, 60_000), state, Context(CATALOG, now=5_010))
    assert other.refusal == "idempotency_conflict"
