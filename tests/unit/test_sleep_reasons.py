"""Retry reasons and durable sleep, pure: decide and reduce with a clock given by hand."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest

from processor.clients.client import new_submit, status_dict
from processor.facts.keyring import KeyRing
from processor.facts.models import (
    CancelRun,
    ContinuationSegmentCreated,
    FactHeader,
    RetryScheduled,
    RunFailed,
    RunStopped,
    RunSucceeded,
    SegmentFailed,
    SegmentResult,
    SleepCompleted,
    SleepStarted,
    StepCompleted,
    StepOutput,
    WorkItem,
)
from processor.model import attempts
from processor.model.decide import (
    Context,
    Decision,
    TimerFired,
    decide_cancel,
    decide_result,
    decide_submit,
    decide_timer,
)
from processor.model.due import DueEntry, due_entries
from processor.model.pipeline_spec import PipelineSpec, RetryPolicy, SleepSpec, StepSpec
from processor.model.reduce import fold
from processor.model.state import RunState

FAST = RetryPolicy(max_attempts=3, initial_backoff_ms=10)
#: prepare, then a 5 s sleep, then ship.
NAP = PipelineSpec(
    "nap",
    1,
    (
        StepSpec("prepare", FAST, 1_000),
        StepSpec("nap", FAST, 1_000, sleeps=SleepSpec(5_000)),
        StepSpec("ship", FAST, 1_000),
    ),
)
#: a sleep until a time the step computes, as the last step.
UNTIL = PipelineSpec(
    "until",
    1,
    (StepSpec("prepare", FAST, 1_000), StepSpec("wait", FAST, 1_000, sleeps=SleepSpec(None))),
)
ONCE = PipelineSpec("once", 1, (StepSpec("only", RetryPolicy(max_attempts=1), 1_000),))


class Catalog:
    specs: ClassVar[dict[str, PipelineSpec]] = {s.name: s for s in (NAP, UNTIL, ONCE)}

    def latest(self, name: str) -> PipelineSpec | None:
        return self.specs.get(name)

    def get(self, name: str, version: int) -> PipelineSpec | None:
        return self.specs.get(name)


class Run:
    """One run driven by hand through the pure deciders."""

    def __init__(self, pipeline: str, deadline_in: int | None = None) -> None:
        self.now = 100_000
        self.facts: list[FactHeader] = []
        self.work: list[WorkItem] = []
        deadline = None if deadline_in is None else self.now + deadline_in
        command = new_submit(pipeline, {"order": 1}, deadline_ms=deadline)
        self.run_id = command.run_id
        self.take(decide_submit(command, None, self.ctx))

    @property
    def ctx(self) -> Context:
        return Context(Catalog(), self.now, KeyRing.single(b"secret-secret-secret"))

    @property
    def state(self) -> RunState:
        state = fold(self.facts)
        assert state is not None
        return state

    def take(self, decision: Decision) -> Decision:
        self.facts.extend(decision.facts)
        self.work += [e.value for e in decision.emits if isinstance(e.value, WorkItem)]
        return decision

    def new(self, since: int) -> list[FactHeader]:
        return self.facts[since:]

    def result(
        self,
        outcome: str,
        *,
        steps: tuple[int, ...] = (),
        requests: tuple[bytes, ...] = (),
        retryable: bool = True,
    ) -> Decision:
        item = self.work[-1]
        outputs = tuple(
            StepOutput(step=s, output=json.dumps({"out": s}, separators=(",", ":")).encode())
            for s in steps
        )
        failed = outcome == "failed"
        result = SegmentResult(
            result_id=f"r{len(self.facts)}",
            run_id=self.run_id,
            segment=item.segment,
            attempt=item.attempt,
            generation=item.generation,
            steps=outputs,
            outcome=outcome,  # type: ignore[arg-type]
            failed_step=item.first_step + len(steps) if failed else None,
            error="boom" if failed else None,
            error_type="RuntimeError" if failed else None,
            retryable=retryable,
            worker_id="w",
            requests=requests,
        )
        return self.take(decide_result(result, self.state, self.ctx))

    def advance(self, to: int) -> None:
        self.now = to
        for entry in sorted(due_entries(self.state)):
            if entry.due_ms <= self.now:
                self.take(decide_timer(TimerFired(entry), self.state, self.ctx))

    def fire(self, entry: DueEntry) -> Decision:
        return self.take(decide_timer(TimerFired(entry), self.state, self.ctx))

    def cancel(self) -> Decision:
        command = CancelRun(
            command_id=f"c{len(self.facts)}", run_id=self.run_id, requested_ms=self.now
        )
        return self.take(decide_cancel(command, self.state, self.ctx))


def only(facts: list[FactHeader], kind: type[FactHeader]) -> FactHeader:
    found = [f for f in facts if isinstance(f, kind)]
    assert len(found) == 1, [type(f).__name__ for f in facts]
    return found[0]


# --- retry reasons ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "made", "retryable", "reason", "due"),
    [
        (FAST, 1, True, "eligible", 110),
        (FAST, 3, True, "attempts_exhausted", None),
        (FAST, 1, False, "non_retryable", None),
        (RetryPolicy(max_attempts=1), 1, True, "no_policy", None),
    ],
)
def test_the_retry_decision_says_why(
    policy: RetryPolicy, made: int, retryable: bool, reason: str, due: int | None
) -> None:
    assert attempts.retry_decision(policy, made, retryable, 100) == attempts.RetryDecision(
        due, reason
    )
    assert attempts.retry_due_ms(policy, made, retryable, 100) == due


def test_a_retried_failure_records_eligible_and_the_last_one_attempts_exhausted() -> None:
    run = Run("nap")
    mark = len(run.facts)
    run.result("failed")
    failed, retry = only(run.new(mark), SegmentFailed), only(run.new(mark), RetryScheduled)
    assert isinstance(failed, SegmentFailed) and failed.reason == "eligible"
    assert isinstance(retry, RetryScheduled) and retry.reason == "eligible"
    assert run.state.attempt.retry_reason == "eligible"
    assert status_dict(run.state)["retry_reason"] == "eligible"
    for _ in range(2):
        run.advance(run.now + 1_000)
        run.result("failed")
    ended = only(run.facts, RunFailed)
    assert isinstance(ended, RunFailed) and ended.reason == "attempts_exhausted"
    assert run.state.status == "failed" and run.state.attempt.retry_reason == "attempts_exhausted"


def test_a_non_retryable_failure_ends_the_run_with_its_reason() -> None:
    run = Run("nap")
    run.result("failed", retryable=False)
    ended = only(run.facts, RunFailed)
    assert isinstance(ended, RunFailed) and ended.reason == "non_retryable"
    assert not [f for f in run.facts if isinstance(f, RetryScheduled)]


def test_a_step_without_retries_fails_with_no_policy() -> None:
    run = Run("once")
    run.result("failed")
    ended = only(run.facts, RunFailed)
    assert isinstance(ended, RunFailed) and ended.reason == "no_policy"
    assert status_dict(run.state)["retry_reason"] == "no_policy"


def test_the_deadline_fencing_a_pending_retry_is_deadline_elapsed() -> None:
    run = Run("nap", deadline_in=5)
    run.result("failed")
    assert run.state.phase == "retry_wait"
    run.advance(run.now + 5)  # the deadline and the retry are due at once: the deadline wins
    assert run.state.status == "timed_out"
    assert run.state.attempt.retry_reason == "deadline_elapsed"


def test_a_failure_that_settles_after_a_cancel_is_not_retried_cancelled() -> None:
    run = Run("nap")
    run.cancel()  # the attempt is running: it settles first
    mark = len(run.facts)
    run.result("failed")
    failed = only(run.new(mark), SegmentFailed)
    assert isinstance(failed, SegmentFailed) and failed.reason == "cancelled"
    assert run.state.status == "cancelled"


def test_a_cancel_fencing_a_pending_retry_records_cancelled() -> None:
    run = Run("nap")
    run.result("failed")
    run.cancel()
    assert run.state.status == "cancelled" and run.state.attempt.retry_reason == "cancelled"


# --- durable sleep ------------------------------------------------------------------------


def test_a_sleep_fixes_its_wake_time_and_fires_once_with_the_previous_output() -> None:
    run = Run("nap")
    mark = len(run.facts)
    run.result("suspended", steps=(0,))
    started = only(run.new(mark), SleepStarted)
    assert isinstance(started, SleepStarted)
    assert (started.step, started.wake_ms) == (1, run.now + 5_000)
    state = run.state
    assert state.phase == "sleeping" and state.sleep.wake_ms == run.now + 5_000
    timer = DueEntry(run.now + 5_000, run.run_id, "sleep", state.attempt.segment, 1)
    assert timer in due_entries(state)
    assert status_dict(state)["sleeping"] == {"step": 1, "wake_ms": run.now + 5_000}

    run.now += 4_999  # early: nothing happens
    assert run.fire(timer).facts == ()
    run.now += 1
    mark = len(run.facts)
    run.fire(timer)
    new = run.new(mark)
    assert [type(f).__name__ for f in new][:3] == [
        "SleepCompleted",
        "StepCompleted",
        "ContinuationSegmentCreated",
    ]
    completed = only(new, StepCompleted)
    assert isinstance(completed, StepCompleted) and completed.step == 1
    assert completed.output == b'{"out":0}'
    assert isinstance(only(new, ContinuationSegmentCreated), ContinuationSegmentCreated)
    assert run.work[-1].first_step == 2 and run.work[-1].input == b'{"out":0}'
    assert run.state.phase == "dispatched" and run.state.sleep.wake_ms is None
    assert all(e.kind != "sleep" for e in due_entries(run.state))
    assert run.fire(timer).facts == ()  # fired once: the same timer again does nothing

    run.result("completed", steps=(2,))
    assert run.state.status == "succeeded"


def test_a_replay_finds_the_same_wake_time() -> None:
    run = Run("nap")
    run.result("suspended", steps=(0,))
    wake = run.state.sleep.wake_ms
    run.now += 60_000  # a restart much later: the wake time is the journal's
    assert fold(list(run.facts)) == run.state and run.state.sleep.wake_ms == wake
    assert {e.due_ms for e in due_entries(run.state) if e.kind == "sleep"} == {wake}


def test_sleep_until_takes_the_computed_time_and_a_past_one_wakes_at_once() -> None:
    run = Run("until")
    run.result("suspended", steps=(0,), requests=(b"12345",))
    started = only(run.facts, SleepStarted)
    assert isinstance(started, SleepStarted) and started.wake_ms == 12_345
    assert run.now > started.wake_ms
    assert only(run.facts, SleepCompleted) is not None
    ended = only(run.facts, RunSucceeded)
    assert isinstance(ended, RunSucceeded) and ended.result == b'{"out":0}'


def test_sleep_until_a_future_time_waits_for_it() -> None:
    run = Run("until")
    run.result("suspended", steps=(0,), requests=(str(run.now + 3_000).encode(),))
    assert run.state.phase == "sleeping"
    run.advance(run.now + 2_999)
    assert run.state.phase == "sleeping"
    run.advance(run.now + 1)
    assert run.state.status == "succeeded"


def test_sleep_until_none_does_not_sleep() -> None:
    run = Run("until")
    run.result("suspended", steps=(0,), requests=(b"null",))
    assert run.state.status == "succeeded"


@pytest.mark.parametrize("requests", [(), (b'"soon"',), (b"-1",), (b"1", b"2"), (b"1.5",)])
def test_a_bad_wake_time_is_refused_untouched(requests: tuple[bytes, ...]) -> None:
    run = Run("until")
    before = list(run.facts)
    decision = run.result("suspended", steps=(0,), requests=requests)
    assert decision.refusal == "malformed_result" and run.facts == before


def test_a_fixed_sleep_takes_no_wake_time_from_the_worker() -> None:
    run = Run("nap")
    decision = run.result("suspended", steps=(0,), requests=(b"5",))
    assert decision.refusal == "malformed_result"


def test_a_cancel_cuts_a_sleep_short() -> None:
    run = Run("nap")
    run.result("suspended", steps=(0,))
    run.cancel()
    state = run.state
    assert state.status == "cancelled" and state.sleep.wake_ms is None
    assert isinstance(only(run.facts, RunStopped), RunStopped)
    assert due_entries(state) == frozenset()
    assert not [f for f in run.facts if isinstance(f, SleepCompleted)]


def test_the_run_deadline_cuts_a_sleep_short() -> None:
    run = Run("nap", deadline_in=2_000)
    run.result("suspended", steps=(0,))
    assert {e.kind for e in due_entries(run.state)} == {"sleep", "run_deadline"}
    run.advance(run.now + 2_000)
    assert run.state.status == "timed_out"
    assert not [f for f in run.facts if isinstance(f, SleepCompleted)]
    run.advance(run.now + 10_000)  # the sleep's time: nothing more
    assert not [f for f in run.facts if isinstance(f, SleepCompleted)]


def test_a_sleep_and_the_deadline_due_together_the_deadline_wins() -> None:
    run = Run("nap", deadline_in=5_000)
    run.result("suspended", steps=(0,))
    run.advance(run.now + 5_000)
    assert run.state.status == "timed_out"
    assert not [f for f in run.facts if isinstance(f, SleepCompleted)]


# --- the definition API and the worker's wake time ----------------------------------------


def test_the_definition_api_makes_sleep_steps_that_end_their_segment() -> None:
    from processor.errors import ConfigurationError
    from processor.worker.pipeline import Pipeline

    pipeline = Pipeline("p")
    pipeline.step()(lambda value: value)
    pipeline.sleep(1.5)
    pipeline.sleep_until("until")(lambda value: None)
    pipeline.step(name="last")(lambda value: value)
    spec = pipeline.spec()
    assert [s.name for s in spec.steps] == ["<lambda>", "sleep_1", "until", "last"]
    assert [s.sleeps for s in spec.steps] == [None, SleepSpec(1_500), SleepSpec(None), None]
    assert [spec.segment_end(first) for first in (0, 2, 3)] == [1, 2, 3]
    with pytest.raises(ConfigurationError):
        pipeline.sleep(-1)


def test_the_worker_reports_a_wake_time_as_epoch_ms_or_refuses_it() -> None:
    from datetime import UTC, datetime, timedelta, timezone

    from processor.worker.executor import _wake

    at = datetime(2030, 1, 1, tzinfo=UTC)
    assert _wake(at) == (b"1893456000000",)
    assert _wake(at.astimezone(timezone(timedelta(hours=2)))) == (b"1893456000000",)
    assert _wake(1_500.7) == (b"1500",)
    assert _wake(None) == (b"null",)
    for bad in (datetime(2030, 1, 1), "soon", True, -5):  # a naive datetime is refused
        with pytest.raises(TypeError):
            _wake(bad)
