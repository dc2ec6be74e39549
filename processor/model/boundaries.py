"""Boundaries: suspension, interaction dispatch, continuation and timeouts.

A segment that reaches an await step suspends: one interaction per request,
each with a signed resume token whose digest is kept. Admissions and timeouts
then go through the continuation planner, whose plan becomes facts here.
"""

from __future__ import annotations

from processor.facts import keys, tokens
from processor.facts.models import (
    BoundaryDispatchCompleted,
    BoundaryInteractionDispatched,
    BoundaryRequest,
    InteractionTimedOut,
    SegmentFailed,
    SegmentResult,
    SegmentSuspended,
)
from processor.facts.payload import canonical_json
from processor.facts.topics import TopicName
from processor.model import control
from processor.model.continuation import (
    FailParent,
    Plan,
    ReleaseItemized,
    ReleaseScalar,
    plan_continuation,
)
from processor.model.decision import Context, FactMaker
from processor.model.pipeline_spec import AwaitSpec, PipelineSpec
from processor.model.transitions import continue_after

#: The retry reason of an await's failure: awaits are not retried (README: retry reasons).
BOUNDARY_FAILED = "boundary_failed"

__all__ = ["apply_plan", "suspend", "timeout_interaction"]


def suspend(maker: FactMaker, spec: PipelineSpec, result: SegmentResult, ctx: Context) -> None:
    state = maker.current
    step = state.attempt.next_step
    awaits = spec.steps[step].awaits
    assert awaits is not None
    boundary = state.attempt.segment
    items = 1 if awaits.kind == "checkpoint" else len(result.requests)
    maker.add(
        SegmentSuspended(
            **maker.header(keys.boundary_suspended(boundary)),
            segment=state.attempt.segment,
            attempt=state.attempt.number,
            generation=state.attempt.generation,
            step=step,
            boundary=boundary,
            kind=awaits.kind,
            target=awaits.target,
            itemized=awaits.itemized,
            items=items,
            on_timeout=awaits.on_timeout,
        )
    )
    requests = result.requests if awaits.kind == "await" else (b"",)
    for index, request in enumerate(requests):
        _dispatch_interaction(maker, awaits, ctx, boundary=boundary, index=index, request=request)
    maker.add(
        BoundaryDispatchCompleted(
            **maker.header(keys.boundary_dispatched(boundary)),
            boundary=boundary,
            interactions=items,
        )
    )
    apply_plan(maker, spec, plan_continuation(maker.current))


def _dispatch_interaction(
    maker: FactMaker, awaits: AwaitSpec, ctx: Context, *, boundary: int, index: int, request: bytes
) -> None:
    state = maker.current
    interaction = keys.interaction_id(boundary, index)
    token = tokens.sign(
        ctx.resume_keys,
        tokens.TokenClaims(state.run_id, boundary, interaction, state.attempt.generation),
    )
    deadline = maker.now + awaits.timeout_ms
    canonical = canonical_json(request) if request else b""
    maker.add(
        BoundaryInteractionDispatched(
            **maker.header(keys.interaction_dispatched(interaction)),
            boundary=boundary,
            interaction=interaction,
            item_index=index,
            target=awaits.target,
            request=canonical,
            deadline_ms=deadline,
            token_digest=tokens.digest(token),
            epoch=state.attempt.generation,
        )
    )
    if awaits.kind == "await":
        maker.emit(
            TopicName.REQUESTS,
            BoundaryRequest(
                run_id=state.run_id,
                boundary=boundary,
                interaction=interaction,
                item_index=index,
                target=awaits.target,
                request=canonical,
                deadline_ms=deadline,
                resume_token=token,
            ),
            awaits.wire,
        )


def apply_plan(maker: FactMaker, spec: PipelineSpec, plan: Plan) -> None:
    """Turn a continuation plan into facts: release, fail, or keep waiting."""
    match plan:
        case ReleaseScalar() | ReleaseItemized():
            _release(maker, spec, plan.input)
        case FailParent():
            _fail_parent(maker, spec, plan)
        case _:
            pass  # NoOp, Hold, RecordItem: the boundary keeps waiting


def _fail_parent(maker: FactMaker, spec: PipelineSpec, plan: FailParent) -> None:
    """An item failed for good: the await step fails, and with it the run's execution."""
    state = maker.current
    step = state.boundary.step if state.boundary.step is not None else state.attempt.next_step
    maker.add(
        SegmentFailed(
            **maker.header(keys.attempt_failed(state.attempt.segment, state.attempt.generation)),
            segment=state.attempt.segment,
            attempt=state.attempt.number,
            generation=state.attempt.generation,
            step=step,
            error=plan.error,
            error_type=plan.error_type,
            retryable=False,
            reason=BOUNDARY_FAILED,
        )
    )
    control.fail_execution(maker, spec, error=plan.error)


def _release(maker: FactMaker, spec: PipelineSpec, released: bytes) -> None:
    """The await step completes with the boundary's output; the next segment begins."""
    state = maker.current
    await_step = state.boundary.step
    assert await_step is not None
    continue_after(maker, spec, boundary=state.boundary.number, step=await_step, output=released)


def timeout_interaction(maker: FactMaker, spec: PipelineSpec, interaction_id: str) -> None:
    """InteractionTimedOut for an open interaction, then whatever the boundary does next."""
    interaction = maker.current.interactions[interaction_id]
    maker.add(
        InteractionTimedOut(
            **maker.header(keys.interaction_timed_out(interaction_id)),
            boundary=interaction.boundary,
            interaction=interaction_id,
            item_index=interaction.item_index,
            deadline_ms=interaction.deadline_ms,
        )
    )
    apply_plan(maker, spec, plan_continuation(maker.current))
