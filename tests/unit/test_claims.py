"""Pure decide of claims: the first claim of a running attempt is granted, every other
answered with the reason it is refused (``processor.model.claims``)."""

from __future__ import annotations

from processor.facts.models import (
    AttemptProgress,
    AttemptStepStarted,
    CancelRun,
    ClaimReply,
    WorkItem,
)
from processor.facts.topics import TopicName
from processor.model.decide import Decision, decide_cancel, decide_claim
from processor.model.pipeline_spec import PipelineSpec, StepSpec
from tests.unit.test_progress import SPECS, Run


def _claim(
    run: Run, worker: str, *, item: WorkItem | None = None, step: int | None = None
) -> Decision:
    return run.report(worker=worker, item=item, step=step, claim=True)


def _reply(decision: Decision) -> ClaimReply:
    (emit,) = decision.emits
    assert emit.topic is TopicName.CONTROL and isinstance(emit.value, ClaimReply)
    return emit.value


def test_the_first_claim_is_granted_and_starts_the_attempts_timers() -> None:
    run = Run("fx")
    run.now = 7_000
    decision = _claim(run, "w1/a")
    (started,) = decision.facts
    assert isinstance(started, AttemptStepStarted)
    assert (started.worker_id, started.step, started.redelivered) == ("w1/a", 0, False)
    assert (started.expires_ms, started.heartbeat_due_ms) == (7_000 + 4_000, 7_000 + 1_000)
    reply = _reply(decision)
    assert (reply.granted, reply.worker_id, reply.reason) == (True, "w1/a", None)
    assert (reply.segment, reply.attempt, reply.generation) == (1, 1, run.work[-1].generation)


def test_the_same_claimant_asking_again_is_granted_again_and_nothing_is_recorded() -> None:
    run = Run("fx")
    _claim(run, "w1/a")
    again = _claim(run, "w1/a")
    assert again.facts == () and _reply(again).granted


def test_a_claim_of_an_attempt_another_worker_claimed_is_refused() -> None:
    run = Run("fx")
    _claim(run, "w1/a")
    other = _claim(run, "w2/b")
    reply = _reply(other)
    assert (other.refusal, other.facts) == ("attempt_claimed", ())
    assert (reply.granted, reply.reason, reply.worker_id) == (False, "attempt_claimed", "w2/b")
    assert "w1/a" in (reply.detail or "")


def test_a_claim_of_an_attempt_that_became_unknown_is_refused_as_stale() -> None:
    run = Run("fx")
    item = run.work[-1]
    _claim(run, "w1/a")
    run.advance(run.now + 1_000)  # its heartbeat stopped: effectful, so Unknown
    assert run.state.phase == "unknown"
    late = _claim(run, "w2/b", item=item)
    assert late.refusal == "stale_attempt" and _reply(late).reason == "stale_attempt"


def test_a_claim_while_the_run_is_stopping_is_refused_so_the_claimant_fails_it() -> None:
    run = Run("fx")
    cancel = CancelRun(command_id="c", run_id=run.run_id, reason="user", requested_ms=run.now)
    run.take(decide_cancel(cancel, run.state, run.ctx))
    assert run.state.phase == "dispatched"  # the attempt settles first
    decision = _claim(run, "w1/a")
    assert (decision.refusal, decision.facts) == ("run_stopping", ())
    assert _reply(decision).reason == "run_stopping"


def test_a_claim_of_another_step_than_the_attempts_first_is_malformed() -> None:
    run = Run("fx")
    decision = _claim(run, "w1/a", step=1)
    assert (decision.refusal, _reply(decision).reason) == ("malformed_progress",) * 2


def test_a_claim_for_no_run_is_answered() -> None:
    run = Run("fx")
    item = run.work[-1].model_copy(update={"run_id": "no-such-run"})
    claim = AttemptProgress(
        run_id=item.run_id,
        segment=item.segment,
        attempt=item.attempt,
        generation=item.generation,
        step=0,
        report="started",
        worker_id="w",
        at_ms=run.now,
        claim=True,
    )
    decision = decide_claim(claim, None, run.ctx)
    assert (decision.refusal, _reply(decision).reason) == ("unknown_run",) * 2


def test_attempts_that_may_run_an_effectful_step_or_undo_one_need_a_claim() -> None:
    fx = SPECS["fx"]
    assert fx.needs_claim("forward", 0)  # pay (effectful) then ship, one segment
    assert not SPECS["hb"].needs_claim("forward", 0)
    steps = (
        StepSpec("plain"),
        StepSpec("pay", effectful=True),
        StepSpec("after"),
    )
    spec = PipelineSpec("p", 1, steps)
    assert spec.needs_claim("forward", 0) and not spec.needs_claim("forward", 2)
    assert spec.needs_claim("compensate", 1) and not spec.needs_claim("compensate", 0)
