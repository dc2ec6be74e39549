"""Pure decide/reduce of attempt progress: timers from the start, heartbeats, losses."""

from __future__ import annotations

from processor.clients.client import new_submit
from processor.facts.models import (
    AttemptHeartbeatRecorded,
    AttemptLost,
    AttemptOutcomeUnknown,
    AttemptProgress,
    AttemptStepStarted,
    CompensationAttemptFailed,
    CompensationAttemptStarted,
    FactHeader,
    SegmentFailed,
    SegmentResult,
    StepOutput,
    StopNotice,
    WorkItem,
)
from processor.facts.topics import TopicName
from processor.model.attempts import NO_EXPIRY
from processor.model.decide import (
    Context,
    Decision,
    TimerFired,
    decide_claim,
    decide_progress,
    decide_result,
    decide_submit,
    decide_timer,
)
from processor.model.due import due_entries
from processor.model.pipeline_spec import CompensationSpec, PipelineSpec, RetryPolicy, StepSpec
from processor.model.reduce import fold
from processor.model.state import RunState

ONCE = RetryPolicy(max_attempts=1)
UNDO = CompensationSpec(RetryPolicy(max_attempts=2, initial_backoff_ms=10), timeout_ms=30_000)


def _undone(name: str, **timers: int) -> PipelineSpec:
    """``book`` (compensated by ``UNDO``, with ``timers`` for its attempts), then ``pay``."""
    book = StepSpec("book", ONCE, timeout_ms=1_000, compensation=UNDO, **timers)
    return PipelineSpec(name, 1, (book, StepSpec("pay", ONCE, timeout_ms=1_000)))


SPECS = {
    # The compensator of ``book`` heartbeats; the second one also has a queue bound.
    "undo": _undone("undo", heartbeat_timeout_ms=2_000),
    "undo_queued": _undone("undo_queued", schedule_to_start_timeout_ms=5_000),
    "hb": PipelineSpec(
        "hb",
        1,
        (
            StepSpec("a", ONCE, timeout_ms=10_000, heartbeat_timeout_ms=1_000),
            StepSpec("b", ONCE, timeout_ms=3_000),
        ),
    ),
    "fx": PipelineSpec(
        "fx",
        1,
        (
            StepSpec("pay", ONCE, timeout_ms=4_000, effectful=True, heartbeat_timeout_ms=1_000),
            StepSpec("ship", ONCE, timeout_ms=9_000),
        ),
    ),
}


class Catalog:
    def latest(self, name: str) -> PipelineSpec | None:
        return SPECS.get(name)

    def get(self, name: str, version: int) -> PipelineSpec | None:
        return SPECS.get(name)


class Run:
    def __init__(
        self, pipeline: str, *, max_losses: int = 20, deadline_ms: int | None = None
    ) -> None:
        self.now = 1_000
        self.max_losses = max_losses
        self.facts: list[FactHeader] = []
        self.work: list[WorkItem] = []
        self.notices: list[tuple[TopicName, StopNotice]] = []
        command = new_submit(pipeline, {"x": 1}, deadline_ms=deadline_ms)
        self.run_id = command.run_id
        self.take(decide_submit(command, None, self.ctx))

    @property
    def ctx(self) -> Context:
        return Context(Catalog(), self.now, max_infrastructure_losses=self.max_losses)

    @property
    def state(self) -> RunState:
        state = fold(self.facts)
        assert state is not None
        return state

    def take(self, decision: Decision) -> Decision:
        self.facts.extend(decision.facts)
        self.work.extend(e.value for e in decision.emits if isinstance(e.value, WorkItem))
        self.notices.extend(
            (e.topic, e.value) for e in decision.emits if isinstance(e.value, StopNotice)
        )
        return decision

    def report(
        self,
        report: str = "started",
        *,
        step: int | None = None,
        worker: str = "w",
        item: WorkItem | None = None,
        claim: bool = False,
    ) -> Decision:
        """A worker's report on ``item`` (default: the latest), its first step by default;
        with ``claim``, its claim of the attempt (``model.claims``)."""
        item = item or self.work[-1]
        progress = AttemptProgress(
            run_id=self.run_id,
            kind=item.kind,
            segment=item.segment,
            attempt=item.attempt,
            generation=item.generation,
            step=item.first_step if step is None else step,
            report=report,  # type: ignore[arg-type]
            worker_id=worker,
            at_ms=self.now,
            claim=claim,
        )
        decide = decide_claim if claim else decide_progress
        return self.take(decide(progress, self.state, self.ctx))

    def fail_to_unwind(self) -> WorkItem:
        """``book`` completes, ``pay`` fails for good: the compensator of ``book`` is
        dispatched; its work item."""
        item = self.work[-1]
        result = SegmentResult(
            result_id="r-fail",
            run_id=self.run_id,
            segment=item.segment,
            attempt=item.attempt,
            generation=item.generation,
            steps=(StepOutput(step=0, output=b'{"booked": 1}'),),
            outcome="failed",
            failed_step=1,
            error="declined",
            error_type="Declined",
            retryable=False,
            worker_id="w",
        )
        self.take(decide_result(result, self.state, self.ctx))
        compensator = self.work[-1]
        assert (compensator.kind, compensator.first_step) == ("compensate", 0)
        return compensator

    def advance(self, to: int) -> None:
        self.now = to
        for entry in sorted(due_entries(self.state)):
            if entry.due_ms <= self.now:
                self.take(decide_timer(TimerFired(entry), self.state, self.ctx))


def test_dispatch_arms_no_timer_and_a_start_report_arms_them_from_now() -> None:
    run = Run("hb")
    assert run.work[0].expires_ms == NO_EXPIRY and due_entries(run.state) == frozenset()
    run.now = 50_000  # queued for a long time: nothing fired
    (started,) = run.report().facts
    assert isinstance(started, AttemptStepStarted)
    assert (started.expires_ms, started.heartbeat_due_ms) == (50_000 + 13_000, 51_000)
    kinds = sorted((e.kind, e.due_ms) for e in due_entries(run.state))
    assert kinds == [("attempt_timeout", 63_000), ("heartbeat_timeout", 51_000)]


def test_heartbeats_within_half_a_timeout_are_absorbed() -> None:
    run = Run("hb")
    run.report()
    run.now += 400
    assert run.report("heartbeat").facts == ()  # due in 600 ms > half of 1 s: absorbed
    run.now += 200
    (beat,) = run.report("heartbeat").facts
    assert isinstance(beat, AttemptHeartbeatRecorded) and beat.heartbeat_due_ms == run.now + 1_000


def test_progress_of_another_attempt_is_stale() -> None:
    run = Run("hb")
    stale = run.work[-1].model_copy(update={"generation": 7})
    run.work.append(stale)
    decision = run.report()
    assert (decision.refusal, decision.facts) == ("stale_attempt", ())


def test_a_lost_heartbeat_retries_at_once_off_the_budget_until_the_bound() -> None:
    run = Run("hb", max_losses=1)
    run.report()
    run.advance(run.now + 1_000)
    assert [type(f).__name__ for f in run.facts[-2:]] == ["AttemptLost", "SegmentAttemptStarted"]
    assert (run.state.infrastructure_losses, run.state.attempt.step_attempts) == (1, 1)
    run.report()
    run.advance(run.now + 1_000)  # past the bound: the loss is a failure of the one attempt
    failed = [f for f in run.facts if isinstance(f, SegmentFailed)]
    assert len(failed) == 1 and failed[0].error_type == "heartbeat_timeout"
    assert run.state.status == "failed"


def test_an_effectful_step_is_unknown_after_its_own_timeout_or_a_lost_heartbeat() -> None:
    run = Run("fx")
    (started,) = run.report().facts
    assert isinstance(started, AttemptStepStarted) and started.expires_ms == run.now + 4_000
    run.advance(run.now + 1_000)  # heartbeats stopped: never retried blindly
    assert isinstance(run.facts[-1], AttemptOutcomeUnknown)
    assert not any(isinstance(f, AttemptLost) for f in run.facts)


def test_a_lost_attempt_gets_a_stop_notice_it_may_still_run_somewhere() -> None:
    run = Run("hb")
    run.report()
    lost = run.work[-1]
    run.advance(run.now + 1_000)
    assert [(topic, n.segment, n.attempt, n.generation, n.reason) for topic, n in run.notices] == [
        (TopicName.CONTROL, lost.segment, lost.attempt, lost.generation, "attempt_lost")
    ]
    assert run.work[-1].generation == lost.generation + 1  # the next one is not stopped


# --- compensators: the same timing rules -----------------------------------------------------


def test_a_compensator_is_dispatched_with_no_timer_not_even_the_passed_run_deadline() -> None:
    run = Run("undo", deadline_ms=900_000)
    item = run.fail_to_unwind()
    (dispatched,) = [f for f in run.facts if isinstance(f, CompensationAttemptStarted)]
    assert dispatched.expires_ms is None and run.state.compensation.expires_ms is None
    assert item.expires_ms == NO_EXPIRY  # recovery is not bounded by the run deadline
    assert due_entries(run.state) == frozenset()
    run.advance(2_000_000)  # queued for a long time: nothing fired
    assert run.facts[-1] == dispatched


def test_a_compensator_with_a_schedule_to_start_timeout_has_only_that_timer() -> None:
    run = Run("undo_queued")
    item = run.fail_to_unwind()
    assert item.expires_ms == run.now + 5_000
    assert [(e.kind, e.due_ms, e.scope, e.ordinal) for e in due_entries(run.state)] == [
        ("schedule_to_start_timeout", run.now + 5_000, 0, 1)
    ]


def test_a_compensator_start_report_arms_its_timeout_and_heartbeat_from_then() -> None:
    run = Run("undo")
    item = run.fail_to_unwind()
    run.now += 50_000  # queued for far longer than its 30 s timeout
    (started,) = run.report().facts
    assert isinstance(started, AttemptStepStarted) and started.kind == "compensate"
    assert (started.segment, started.step, started.attempt, started.generation) == (0, 0, 1, 1)
    assert (started.expires_ms, started.heartbeat_due_ms) == (run.now + 30_000, run.now + 2_000)
    assert started.fact_key.startswith("compensate/0/generation/1/")
    kinds = sorted((e.kind, e.due_ms) for e in due_entries(run.state))
    assert kinds == [
        ("compensation_timeout", run.now + 30_000),
        ("heartbeat_timeout", run.now + 2_000),
    ]
    assert run.state.attempt.started_step is None  # the forward attempt is not touched
    assert run.report(item=item).facts == ()  # the same start report again
    compensator = run.state.compensation
    assert (compensator.worker_id, compensator.expires_ms) == ("w", run.now + 30_000)


def test_a_compensator_heartbeat_moves_its_timer_with_the_forward_throttle() -> None:
    run = Run("undo")
    run.fail_to_unwind()
    run.report()
    run.now += 800
    assert run.report("heartbeat").facts == ()  # due in 1.2 s > half of 2 s: absorbed
    run.now += 300
    (beat,) = run.report("heartbeat").facts
    assert isinstance(beat, AttemptHeartbeatRecorded) and beat.kind == "compensate"
    assert beat.heartbeat_due_ms == run.now + 2_000
    assert run.state.compensation.heartbeat_due_ms == run.now + 2_000
    assert run.state.attempt.heartbeat_due_ms is None


def test_a_started_compensator_whose_heartbeats_stop_is_unknown_at_its_heartbeat_timeout() -> None:
    run = Run("undo")
    run.fail_to_unwind()
    run.report()
    started_at = run.now
    run.advance(started_at + 1_999)
    assert not isinstance(run.facts[-1], AttemptOutcomeUnknown)
    run.advance(started_at + 2_000)  # not its 30 s timeout: its heartbeat timeout
    unknown = run.facts[-1]
    assert isinstance(unknown, AttemptOutcomeUnknown) and unknown.kind == "compensate"
    assert (unknown.segment, unknown.generation, unknown.time_ms) == (0, 1, started_at + 2_000)
    assert run.state.phase == "unknown" and due_entries(run.state) == frozenset()
    assert not any(isinstance(f, AttemptLost) for f in run.facts)


def test_a_compensator_not_started_in_time_is_dispatched_again_off_its_budget() -> None:
    run = Run("undo_queued", max_losses=1)
    queued = run.fail_to_unwind()
    run.advance(run.now + 5_000)
    lost = run.facts[-2]
    assert isinstance(lost, AttemptLost)
    assert (lost.kind, lost.cause, lost.losses, lost.segment, lost.generation) == (
        "compensate",
        "schedule_to_start_timeout",
        1,
        0,
        1,
    )
    again = run.work[-1]
    assert (again.kind, again.attempt, again.generation) == ("compensate", 1, 2)  # not charged
    assert isinstance(run.facts[-1], CompensationAttemptStarted)
    assert [(n.kind, n.generation, n.reason) for _, n in run.notices] == [
        ("compensate", queued.generation, "attempt_lost")
    ]
    state = run.state
    assert (state.infrastructure_losses, state.compensation.attempt) == (1, 1)
    # Past the bound, a loss is a failure of the compensator, retried by its policy.
    run.advance(run.now + 5_000)
    failed = run.facts[-1]
    assert isinstance(failed, CompensationAttemptFailed)
    assert (failed.error_type, failed.attempt, failed.reason) == (
        "schedule_to_start_timeout",
        1,
        "eligible",
    )
    assert run.state.phase == "compensation_retry_wait"


def test_a_compensator_started_just_in_time_is_not_lost() -> None:
    run = Run("undo_queued")
    run.fail_to_unwind()
    run.now += 4_999
    run.report()
    run.advance(run.now + 29_999)  # long past its schedule-to-start timeout
    assert not any(isinstance(f, AttemptLost | AttemptOutcomeUnknown) for f in run.facts)
    assert [e.kind for e in due_entries(run.state)] == ["compensation_timeout"]


def test_compensator_reports_are_refused_as_forward_ones_are() -> None:
    run = Run("undo")
    item = run.fail_to_unwind()
    forward = next(w for w in run.work if w.kind == "forward")
    refusals = {
        "stale generation": run.report(item=item.model_copy(update={"generation": 7})),
        "the forward attempt": run.report(item=forward),
        "another step": run.report(step=1),
        "unknown kind": run.report(item=item.model_copy(update={"kind": "undo"})),
        "heartbeat first": run.report("heartbeat"),
    }
    assert {why: d.refusal for why, d in refusals.items()} == {
        "stale generation": "stale_attempt",
        "the forward attempt": "stale_attempt",
        "another step": "malformed_progress",
        "unknown kind": "malformed_progress",
        "heartbeat first": "step_not_started",
    }
    assert all(d.facts == () for d in refusals.values())
    run.report(worker="a")
    assert run.report("heartbeat", worker="b").refusal == "stale_progress"
    (again,) = run.report(worker="b").facts  # redelivered to another worker: counted
    assert isinstance(again, AttemptStepStarted) and again.redelivered
    assert run.state.infrastructure_losses == 1 and run.state.compensation.worker_id == "b"
