"""Pure decide/reduce of attempt progress: timers from the start, heartbeats, losses."""

from __future__ import annotations

from processor.clients.client import new_submit
from processor.facts.models import (
    AttemptHeartbeatRecorded,
    AttemptLost,
    AttemptOutcomeUnknown,
    AttemptProgress,
    AttemptStepStarted,
    FactHeader,
    SegmentFailed,
    StopNotice,
    WorkItem,
)
from processor.facts.topics import TopicName
from processor.model.attempts import NO_EXPIRY
from processor.model.decide import (
    Context,
    Decision,
    TimerFired,
    decide_progress,
    decide_submit,
    decide_timer,
)
from processor.model.due import due_entries
from processor.model.pipeline_spec import PipelineSpec, RetryPolicy, StepSpec
from processor.model.reduce import fold
from processor.model.state import RunState

ONCE = RetryPolicy(max_attempts=1)
SPECS = {
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
    def __init__(self, pipeline: str, *, max_losses: int = 20) -> None:
        self.now = 1_000
        self.max_losses = max_losses
        self.facts: list[FactHeader] = []
        self.work: list[WorkItem] = []
        self.notices: list[tuple[TopicName, StopNotice]] = []
        command = new_submit(pipeline, {"x": 1})
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

    def report(self, report: str = "started", *, step: int = 0, worker: str = "w") -> Decision:
        item = self.work[-1]
        progress = AttemptProgress(
            run_id=self.run_id,
            segment=item.segment,
            attempt=item.attempt,
            generation=item.generation,
            step=step,
            report=report,  # type: ignore[arg-type]
            worker_id=worker,
            at_ms=self.now,
        )
        return self.take(decide_progress(progress, self.state, self.ctx))

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
