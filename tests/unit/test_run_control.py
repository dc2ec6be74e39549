"""Run control, pure: deadlines, cancel, Unknown attempts, operator resolution, compensation."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from processor.clients.client import new_submit
from processor.facts.keyring import KeyRing
from processor.facts.models import (
    AttemptProgress,
    CancelRun,
    CommandReply,
    FactHeader,
    ResolveAttempt,
    RunFailed,
    RunStopped,
    SegmentResult,
    StepOutput,
    WorkItem,
)
from processor.model.decide import (
    Context,
    Decision,
    TimerFired,
    decide_cancel,
    decide_progress,
    decide_resolve,
    decide_result,
    decide_submit,
    decide_timer,
)
from processor.model.due import due_entries
from processor.model.pipeline_spec import (
    AwaitSpec,
    CompensationSpec,
    PipelineSpec,
    RetryPolicy,
    StepSpec,
)
from processor.model.reduce import fold
from processor.model.state import RunState

COMPENSATE = CompensationSpec(RetryPolicy(max_attempts=2, initial_backoff_ms=10), timeout_ms=500)
SPEC = PipelineSpec(
    "ctl",
    1,
    (
        StepSpec(
            "reserve",
            RetryPolicy(max_attempts=3, initial_backoff_ms=10),
            1_000,
            compensation=COMPENSATE,
        ),
        StepSpec(
            "charge",
            RetryPolicy(max_attempts=3, initial_backoff_ms=10),
            1_000,
            effectful=True,
            compensation=COMPENSATE,
        ),
        StepSpec("notify", RetryPolicy(max_attempts=3, initial_backoff_ms=10), 1_000),
        StepSpec("ship", RetryPolicy(max_attempts=3, initial_backoff_ms=10), 1_000),
    ),
)
WAITING = PipelineSpec(
    "waiting",
    1,
    (
        StepSpec("hold", compensation=COMPENSATE),
        StepSpec("ask", awaits=AwaitSpec("svc", 5_000)),
        StepSpec("done"),
    ),
)


class Catalog:
    specs: ClassVar[dict[str, PipelineSpec]] = {s.name: s for s in (SPEC, WAITING)}

    def latest(self, name: str) -> PipelineSpec | None:
        return self.specs.get(name)

    def get(self, name: str, version: int) -> PipelineSpec | None:
        return self.specs.get(name)


class Run:
    """One run driven by hand through the pure deciders."""

    def __init__(self, pipeline: str = "ctl", deadline_in: int | None = None) -> None:
        self.now = 100_000
        self.facts: list[FactHeader] = []
        self.work: list[WorkItem] = []
        self.replies: list[CommandReply] = []
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
        for emit in decision.emits:
            if isinstance(emit.value, WorkItem):
                self.work.append(emit.value)
            if isinstance(emit.value, CommandReply):
                self.replies.append(emit.value)
        return decision

    def types(self, since: int = 0) -> list[str]:
        return [type(f).__name__ for f in self.facts[since:]]

    def result(
        self,
        *,
        done: int = 99,
        fail: bool = False,
        retryable: bool = True,
        item: WorkItem | None = None,
        suspend: bool = False,
    ) -> Decision:
        """A worker result for ``item`` (default: the latest work item)."""
        item = item or self.work[-1]
        if item.kind == "compensate":
            return self.take(
                decide_result(
                    self._result(item, (), "failed" if fail else "completed", retryable),
                    self.state,
                    self.ctx,
                )
            )
        end = SPEC.last_step if self.state.pipeline == "ctl" else 0
        steps = (
            range(item.first_step, min(end, item.first_step + done - 1) + 1)
            if not fail
            else range(item.first_step, item.first_step + done)
        )
        outputs = tuple(StepOutput(step=s, output=json.dumps({"step": s}).encode()) for s in steps)
        outcome = "suspended" if suspend else "failed" if fail else "completed"
        result = self._result(item, outputs, outcome, retryable)
        if suspend:
            result = result.model_copy(update={"requests": (b'{"q":1}',)})
        return self.take(decide_result(result, self.state, self.ctx))

    def _result(
        self, item: WorkItem, steps: tuple[StepOutput, ...], outcome: str, retryable: bool
    ) -> SegmentResult:
        failed = outcome == "failed"
        return SegmentResult(
            result_id=f"r{len(self.facts)}",
            run_id=self.run_id,
            segment=item.segment,
            attempt=item.attempt,
            generation=item.generation,
            steps=steps,
            outcome=outcome,  # type: ignore[arg-type]
            failed_step=(item.first_step + len(steps))
            if failed and item.kind == "forward"
            else None,
            error="boom" if failed else None,
            error_type="RuntimeError" if failed else None,
            retryable=retryable,
            worker_id="w",
            kind=item.kind,
        )

    def started(self, step: int | None = None, worker: str = "w") -> Decision:
        """The latest work item's worker reports ``step`` (default: its first) started."""
        item = self.work[-1]
        report = AttemptProgress(
            run_id=self.run_id,
            kind=item.kind,
            segment=item.segment,
            attempt=item.attempt,
            generation=item.generation,
            step=item.first_step if step is None else step,
            report="started",
            worker_id=worker,
            at_ms=self.now,
        )
        return self.take(decide_progress(report, self.state, self.ctx))

    def advance(self, to: int) -> None:
        self.now = to
        for entry in sorted(due_entries(self.state)):
            if entry.due_ms <= self.now:
                self.take(decide_timer(TimerFired(entry), self.state, self.ctx))

    def cancel(self) -> Decision:
        command = CancelRun(
            command_id=f"c{len(self.facts)}",
            run_id=self.run_id,
            reason="user",
            requested_ms=self.now,
        )
        return self.take(decide_cancel(command, self.state, self.ctx))

    def resolve(
        self,
        action: str,
        *,
        key: str = "k1",
        output: Any = None,
        error: str | None = None,
        generation: int | None = None,
        kind: str = "forward",
        both: bool = False,
        segment: int | None = None,
        attempt: int | None = None,
    ) -> Decision:
        unknown = self.state.unknown
        if segment is None or attempt is None:
            segment, attempt = (unknown.segment, unknown.attempt) if unknown else (1, 1)
        gen = generation if generation is not None else (unknown.generation if unknown else 1)
        command = ResolveAttempt(
            command_id=f"o{len(self.facts)}",
            run_id=self.run_id,
            kind=kind,
            segment=segment,
            attempt=attempt,
            generation=gen,
            idempotency_key=key,
            action=action,
            output=json.dumps(output).encode() if action == "succeed" or both else None,
            error=error if action == "fail" or both else None,
        )
        return self.take(decide_resolve(command, self.state, self.ctx))


def make_unknown(run: Run) -> None:
    """Complete step 0, then lose the attempt at the effectful step 1."""
    run.result(done=1, fail=True)  # step 0 completes, step 1 fails retryably
    run.advance(run.state.attempt.retry_due_ms or 0)  # generation 2 starts at step 1
    run.started()  # a worker starts it...
    run.advance(run.state.attempt.expires_ms or 0)  # ...and it is lost


# --- deadlines ------------------------------------------------------------------------------


def test_a_result_at_the_deadline_commits_timed_out_first_and_schedules_no_retry() -> None:
    run = Run(deadline_in=500)
    run.now = run.state.deadline_ms or 0
    before = len(run.facts)
    decision = run.result(done=0, fail=True, retryable=True)
    assert run.types(before)[0] == "RunStopRequested"
    assert "RetryScheduled" not in run.types(before)
    assert decision.facts[0].reason == "timed_out"  # type: ignore[attr-defined]
    final = run.facts[-1]
    assert isinstance(final, RunStopped) and (final.execution, final.recovery) == (
        "TimedOut",
        "NotRequired",
    )


def test_a_late_success_after_the_deadline_is_compensated() -> None:
    run = Run(deadline_in=500)
    run.now = (run.state.deadline_ms or 0) + 1
    run.result(done=2, fail=True)  # steps 0 and 1 completed, step 2 failed, after the deadline
    assert run.state.stop.reason == "timed_out"
    assert run.types()[-2:] == ["CompensationStarted", "CompensationAttemptStarted"]
    assert [w.first_step for w in run.work if w.kind == "compensate"] == [1]  # reverse order
    run.result()
    assert [w.first_step for w in run.work if w.kind == "compensate"] == [1, 0]
    run.result()
    final = run.facts[-1]
    assert isinstance(final, RunStopped) and (final.execution, final.recovery) == (
        "TimedOut",
        "Compensated",
    )


def test_the_deadline_timer_stops_a_waiting_run_and_settles_the_running_attempt_first() -> None:
    run = Run(deadline_in=500)
    run.advance(run.state.deadline_ms or 0)
    assert run.state.stop.reason == "timed_out" and not run.state.terminal  # attempt still running
    run.result(done=99)  # it settles: every step completed, after the stop
    assert "RunSucceeded" not in run.types()
    assert [w.first_step for w in run.work if w.kind == "compensate"] == [1]  # 3, 2 skipped
    run.result()
    run.result()
    final = run.facts[-1]
    assert isinstance(final, RunStopped) and final.execution == "TimedOut"
    assert final.recovery == "PartiallyCompensated"  # notify and ship have no compensator


# --- cancellation ---------------------------------------------------------------------------


def test_stop_intent_commits_once_and_the_first_reason_wins() -> None:
    run = Run(deadline_in=10_000)
    run.result(done=1, fail=True)  # retry_wait: nothing running
    assert run.cancel().facts[0].reason == "cancelled"  # type: ignore[attr-defined]
    assert run.cancel().facts == ()  # the same stop again: no fact
    run.advance((run.state.deadline_ms or 0) + 1)  # the deadline passes while compensating
    run.result()  # the compensator of step 0
    assert len([t for t in run.types() if t == "RunStopRequested"]) == 1
    assert run.state.status == "cancelled" and run.state.execution == "Cancelled"
    count = len(run.facts)
    assert run.cancel().refusal == "run_terminal"
    assert len(run.facts) == count


def test_a_repeated_cancel_while_stopping_adds_no_fact() -> None:
    run = Run()
    run.cancel()  # the first attempt is still running: the run is stopping
    assert run.state.stopping
    count = len(run.facts)
    repeat = run.cancel()
    assert repeat.facts == () and repeat.refusal is None
    assert len(run.facts) == count


def test_cancel_fences_a_queued_retry() -> None:
    run = Run()
    run.result(done=0, fail=True)
    assert run.state.phase == "retry_wait"
    run.cancel()
    assert run.state.status == "cancelled" and run.state.recovery == "NotRequired"
    run.advance(run.now + 10_000)
    assert [w.kind for w in run.work] == ["forward"]  # no retry was dispatched


def test_cancel_closes_open_interactions_and_later_completions_are_run_terminal() -> None:
    from processor.admission.admit import admit
    from processor.admission.arrivals import Arrival

    run = Run("waiting")
    run.result(done=1, suspend=True)
    assert run.state.phase == "suspended"
    run.cancel()
    assert run.state.stopping and run.work[-1].kind == "compensate"
    assert all(e.kind != "interaction_timeout" for e in due_entries(run.state))
    arrival = Arrival(
        source="await",
        run_id=run.run_id,
        cause_id="x",
        outcome="success",
        payload=b"1",
        content_type="application/json",
        error=None,
        idempotency_key="k",
    )
    assert admit(arrival, run.state, run.ctx).refusal in ("run_terminal", "unknown_interaction")
    run.result()
    assert (run.state.status, run.state.recovery) == ("cancelled", "Compensated")


def test_a_running_attempt_settles_before_the_run_finishes_stopping() -> None:
    run = Run()
    run.cancel()
    assert run.state.stopping and run.state.phase == "dispatched"
    run.result(done=2, fail=True)  # steps 0 and 1 completed while cancelling
    assert run.types()[-2:] == ["CompensationStarted", "CompensationAttemptStarted"]


# --- unknown outcomes and operator resolution -----------------------------------------------


def test_a_lost_effectful_attempt_becomes_unknown_and_is_not_retried() -> None:
    run = Run()
    make_unknown(run)
    assert run.types()[-1] == "AttemptOutcomeUnknown"
    assert run.state.phase == "unknown" and run.state.unknown is not None
    run.advance(run.now + 60_000)
    assert run.types()[-1] == "AttemptOutcomeUnknown"  # no automatic retry, ever
    assert {e.kind for e in due_entries(run.state)} == set()


def test_explicit_retry_creates_the_next_generation_and_the_old_one_can_never_commit() -> None:
    run = Run()
    make_unknown(run)
    lost = run.work[-1]
    run.resolve("retry")
    assert run.work[-1].generation == lost.generation + 1
    assert run.work[-1].attempt == lost.attempt  # a retry the operator authorized, not the policy
    assert run.result(item=lost).refusal == "stale_attempt"
    run.result()
    assert run.state.status == "succeeded"


def test_supplied_success_continues_after_the_unknown_step() -> None:
    run = Run()
    make_unknown(run)
    run.resolve("succeed", output={"charged": True})
    assert json.loads(run.state.step_outputs[1]) == {"charged": True}
    assert run.work[-1].first_step == 2
    run.result()
    assert run.state.status == "succeeded"


def test_declared_failure_fails_the_run_and_compensates() -> None:
    run = Run()
    make_unknown(run)
    run.resolve("fail", error="charge never happened")
    assert run.types()[-2:] == ["CompensationStarted", "CompensationAttemptStarted"]
    run.result()
    final = run.facts[-1]
    assert isinstance(final, RunFailed) and final.recovery == "Compensated"


def test_an_identical_repeat_returns_the_recorded_response_and_a_changed_one_conflicts() -> None:
    run = Run()
    make_unknown(run)
    unknown = run.state.unknown
    assert unknown is not None
    named = {
        "segment": unknown.segment,
        "attempt": unknown.attempt,
        "generation": unknown.generation,
    }
    run.resolve("retry", key="op-1", **named)
    count = len(run.facts)
    again = run.resolve("retry", key="op-1", **named)  # the attempt is no longer Unknown
    assert again.facts == () and again.refusal is None
    assert run.replies[-1].response == run.replies[-2].response
    assert len(run.facts) == count
    other = run.resolve("fail", key="op-1", error="x", **named)
    assert other.refusal == "idempotency_conflict"


def test_refusals_are_checked_in_order() -> None:
    run = Run(deadline_in=100_000)
    make_unknown(run)
    unknown = run.state.unknown
    assert unknown is not None
    # 1. the request itself, before anything else
    assert (
        run.resolve("succeed", output=1, error="x", both=True, generation=99).refusal
        == "invalid_request"
    )
    # 3. a stale generation (the key is fresh)
    assert (
        run.resolve("retry", key="k-stale", generation=unknown.generation - 1).refusal
        == "stale_attempt"
    )
    # 4. the deadline policy, last
    run.now = (run.state.deadline_ms or 0) + 1
    assert run.resolve("retry", key="k-late").refusal == "deadline_elapsed"
    assert not any(t == "AttemptResolved" for t in run.types())
    # ...while a supplied success still settles, committing TimedOut stop intent with it
    before = len(run.facts)
    run.resolve("succeed", key="k-ok", output={"charged": True})
    assert run.types(before)[:3] == ["RunStopRequested", "AttemptResolved", "StepCompleted"]
    assert run.state.stop.reason == "timed_out"


def test_retry_after_cancel_is_forbidden_but_success_and_failure_settle() -> None:
    run = Run()
    make_unknown(run)
    run.cancel()
    assert run.state.stopping and run.state.phase == "unknown"
    assert run.resolve("retry", key="r").refusal == "retry_forbidden"
    run.resolve("succeed", key="s", output={"charged": True})
    assert run.types()[-2:] == ["CompensationStarted", "CompensationAttemptStarted"]
    assert [w.first_step for w in run.work if w.kind == "compensate"] == [1]


def test_a_late_worker_result_and_an_operator_command_compete_and_one_commits() -> None:
    worker_first = Run()
    make_unknown(worker_first)
    lost = worker_first.work[-1]
    assert worker_first.result(item=lost).refusal is None  # the late result settles Unknown
    assert worker_first.resolve("retry", generation=lost.generation).refusal == "stale_attempt"

    operator_first = Run()
    make_unknown(operator_first)
    lost = operator_first.work[-1]
    assert operator_first.resolve("fail", error="gave up").refusal is None
    assert operator_first.result(item=lost).refusal == "stale_attempt"


# --- compensation ---------------------------------------------------------------------------


def test_compensators_run_one_at_a_time_in_reverse_completion_order_with_skips() -> None:
    run = Run()
    run.result(done=3, fail=True, retryable=False)  # steps 0, 1, 2 completed; 3 failed
    assert run.state.stop.reason == "failed"
    assert run.types()[-3:] == [
        "CompensationStarted",
        "CompensationStepSkipped",
        "CompensationAttemptStarted",
    ]
    assert run.work[-1].first_step == 1 and run.work[-1].kind == "compensate"
    run.result()
    assert run.work[-1].first_step == 0
    run.result()
    final = run.facts[-1]
    assert isinstance(final, RunFailed)
    assert (final.error, final.recovery) == ("boom", "PartiallyCompensated")


def test_a_compensator_is_retried_by_its_policy_and_a_permanent_failure_stops_the_unwind() -> None:
    run = Run()
    run.result(done=2, fail=True, retryable=False)  # steps 0, 1 completed
    run.result(fail=True)  # compensator of step 1 fails, retryable
    assert run.types()[-1] == "CompensationAttemptFailed"
    run.advance(run.state.compensation.retry_due_ms or 0)
    assert run.work[-1].first_step == 1 and run.work[-1].generation == 2
    run.result(fail=True)  # second and last attempt fails
    final = run.facts[-1]
    assert isinstance(final, RunFailed) and final.recovery == "CompensationFailed"
    assert not any(w.first_step == 0 and w.kind == "compensate" for w in run.work)


def test_a_lost_compensator_attempt_becomes_unknown_and_an_operator_settles_it() -> None:
    run = Run()
    run.result(done=1, fail=True, retryable=False)  # step 0 completed
    run.started()  # a worker starts the compensator...
    run.advance(run.state.compensation.expires_ms or 0)  # ...and it is lost
    assert run.types()[-1] == "AttemptOutcomeUnknown"
    assert run.state.unknown is not None and run.state.unknown.kind == "compensate"
    run.resolve("succeed", kind="compensate", output=None)
    final = run.facts[-1]
    assert isinstance(final, RunFailed) and final.recovery == "Compensated"


def test_success_needs_no_recovery() -> None:
    run = Run()
    run.result()
    assert (run.state.status, run.state.execution, run.state.recovery) == (
        "succeeded",
        "Completed",
        "NotRequired",
    )
