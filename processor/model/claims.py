"""Claims: an attempt that must not run twice runs only once a worker's claim is granted.

Such an attempt (``PipelineSpec.needs_claim``: a forward segment with an effectful
step, or the compensator of one) could otherwise run again when its work item is
delivered again: its worker was lost before it reported the start, or another worker
took over its partition. So a worker about to run it first sends a claim
(``AttemptProgress`` with ``claim``, for the attempt's first step) and waits.

The first claim of a running attempt is granted: ``AttemptStepStarted`` records the
claimant (the attempt's timers run from then, as for a start report) and a granted
``ClaimReply`` goes to segments.control in the same commit. Every other claim is
refused, and its claimant does not run the attempt:

- ``attempt_claimed``: another worker holds the claim (a redelivered work item); if
  that worker is lost, the attempt becomes Unknown at its timeout, for an operator;
- ``stale_attempt``: the attempt is no longer open (superseded, Unknown, resolved,
  or the run ended);
- ``run_stopping``: stop intent committed (a cancel, the deadline): the claimant
  reports the attempt failed without running it, so the stop settles;
- ``unknown_run``, ``unknown_pipeline``, ``malformed_progress``: nothing to run.

The same claimant asking again gets the same answer. Pure.
"""

from __future__ import annotations

from dataclasses import replace

from processor.facts.models import AttemptProgress, ClaimReply
from processor.facts.topics import TopicName
from processor.model.decision import Context, Decision, Emit
from processor.model.progress import attempt_steps, record_start, reported_attempt
from processor.model.state import RunState

__all__ = ["RUN_STOPPING", "WITHOUT_RESULT", "decide_claim"]

#: The refusal whose claimant ends the attempt with a failed result (the stop settles).
RUN_STOPPING = "run_stopping"
#: The refusals whose claimant owes no result: another attempt or worker answers, or
#: nothing waits for one.
WITHOUT_RESULT = frozenset(
    {
        "attempt_claimed",
        "stale_attempt",
        "unknown_run",
        "unknown_pipeline",
        "malformed_progress",
    }
)


def decide_claim(claim: AttemptProgress, state: RunState | None, ctx: Context) -> Decision:
    """Grant or refuse a worker's claim; either way the decision answers it."""
    found = reported_attempt(claim, state)
    if isinstance(found, Decision):
        return _refused(claim, ctx, found.refusal or "stale_attempt", found.detail)
    state, attempt = found
    spec = ctx.catalog.get(state.pipeline, state.pipeline_version)
    if spec is None:
        detail = f"pipeline {state.pipeline!r} v{state.pipeline_version} is not loaded here"
        return _refused(claim, ctx, "unknown_pipeline", detail)
    first, _ = attempt_steps(state, spec, attempt)
    if claim.step != first:
        detail = f"a claim of step {claim.step}; the attempt begins at step {first}"
        return _refused(claim, ctx, "malformed_progress", detail)
    if state.stopping:
        detail = f"the run is stopping ({state.stop.reason})"
        return _refused(claim, ctx, RUN_STOPPING, detail)
    if attempt.started_step is not None:
        if attempt.worker_id == claim.worker_id:
            return Decision(emits=(_reply(claim, ctx, granted=True),))  # asked again
        detail = f"claimed by worker {attempt.worker_id!r}"
        return _refused(claim, ctx, "attempt_claimed", detail)
    started = record_start(claim, state, spec, ctx, attempt, redelivered=False)
    return replace(started, emits=(*started.emits, _reply(claim, ctx, granted=True)))


def _refused(claim: AttemptProgress, ctx: Context, reason: str, detail: str) -> Decision:
    reply = _reply(claim, ctx, granted=False, reason=reason, detail=detail)
    return Decision.refuse(reason, detail, reply)


def _reply(
    claim: AttemptProgress,
    ctx: Context,
    *,
    granted: bool,
    reason: str | None = None,
    detail: str | None = None,
) -> Emit:
    reply = ClaimReply(
        run_id=claim.run_id,
        kind=claim.kind,
        segment=claim.segment,
        attempt=claim.attempt,
        generation=claim.generation,
        worker_id=claim.worker_id,
        granted=granted,
        reason=reason,
        detail=detail,
        at_ms=ctx.now,
    )
    return Emit(TopicName.CONTROL, claim.run_id, reply)
