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
    BoundaryInteractionQueued,
    BoundaryRequest,
    InteractionTimedOut,
    SegmentFailed,
    SegmentResult,
    SegmentSuspended,
)
from processor.facts.payload import canonical_json
from processor.facts.topics import TopicName
from processor.model import children, control, event_waits, graph_run, waits
from processor.model.continuation import (
    FailParent,
    Plan,
    RecordItem,
    ReleaseItemized,
    ReleaseScalar,
    plan_continuation,
)
from processor.model.decision import Context, FactMaker
from processor.model.pipeline_spec import AwaitSpec, PipelineSpec
from processor.model.transitions import continue_after

#: The retry reason of an await's failure: awaits are not retried (README: retry reasons).
BOUNDARY_FAILED = "boundary_failed"

__all__ = ["apply_plan", "continue_boundary", "suspend", "timeout_interaction"]


def suspend(maker: FactMaker, spec: PipelineSpec, result: SegmentResult, ctx: Context) -> None:
    state = maker.current
    step = state.attempt.next_step
    awaits = spec.steps[step].awaits
    assert awaits is not None
    boundary = state.attempt.segment
    items = 1 if awaits.kind in ("checkpoint", "event") else len(result.requests)  # await, child
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
    requests = result.requests if awaits.kind != "checkpoint" else (b"",)
    room = len(requests) if awaits.max_in_flight is None else awaits.max_in_flight
    for index, request in enumerate(requests):
        if index < room:
            _dispatch_interaction(
                maker, awaits, ctx, boundary=boundary, index=index, request=request
            )
        else:  # sent when an earlier item settles (``_dispatch_queued``)
            _queue_interaction(maker, awaits, boundary=boundary, index=index, request=request)
    maker.add(
        BoundaryDispatchCompleted(
            **maker.header(keys.boundary_dispatched(boundary)),
            boundary=boundary,
            interactions=items,
        )
    )
    apply_plan(maker, spec, ctx, _plan(maker, spec))


def _plan(maker: FactMaker, spec: PipelineSpec) -> Plan:
    """The continuation of the boundary ``maker.current`` waits at, with its await's
    tolerance."""
    state = maker.current
    awaits = _awaits(spec, state.boundary.step)
    return plan_continuation(state, None if awaits is None else awaits.tolerance)


def _awaits(spec: PipelineSpec, step: int | None) -> AwaitSpec | None:
    return None if step is None or step > spec.last_step else spec.steps[step].awaits


def _queue_interaction(
    maker: FactMaker, awaits: AwaitSpec, *, boundary: int, index: int, request: bytes
) -> None:
    interaction = keys.interaction_id(boundary, index)
    maker.add(
        BoundaryInteractionQueued(
            **maker.header(keys.interaction_queued(interaction)),
            boundary=boundary,
            interaction=interaction,
            item_index=index,
            target=awaits.target,
            request=canonical_json(request),
        )
    )


def _dispatch_queued(maker: FactMaker, spec: PipelineSpec, ctx: Context) -> None:
    """Send the lowest queued items of an itemized await there is room for now."""
    state = maker.current
    awaits = _awaits(spec, state.boundary.step)
    if awaits is None or awaits.max_in_flight is None or state.stopping:
        return
    interactions = state.boundary_interactions()
    open_ = sum(1 for i in interactions if i.status == "open")
    queued = [i for i in interactions if i.status == "queued"]
    for interaction in queued[: max(awaits.max_in_flight - open_, 0)]:
        _dispatch_interaction(
            maker,
            awaits,
            ctx,
            boundary=interaction.boundary,
            index=interaction.item_index,
            request=interaction.request or b"",
        )


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
            target=event_waits.target_of(awaits, canonical),
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
    elif awaits.kind == "child":  # a run of another pipeline (model/children.py)
        children.start_child(
            maker,
            awaits,
            ctx,
            boundary=boundary,
            index=index,
            request=canonical,
            token=token,
            deadline_ms=deadline,
        )


def apply_plan(maker: FactMaker, spec: PipelineSpec, ctx: Context, plan: Plan) -> None:
    """Turn a continuation plan into facts: release, fail, or keep waiting (and send
    the queued items there is room for)."""
    match plan:
        case ReleaseScalar() | ReleaseItemized():
            _release(maker, spec, plan.input)
        case FailParent():
            _fail_parent(maker, spec, plan)
        case RecordItem():
            _dispatch_queued(maker, spec, ctx)
        case _:
            pass  # NoOp, Hold: the boundary keeps waiting


def continue_boundary(maker: FactMaker, spec: PipelineSpec, ctx: Context) -> None:
    """What the boundary does after an admission: ``apply_plan`` of its continuation."""
    apply_plan(maker, spec, ctx, _plan(maker, spec))


def _fail_parent(maker: FactMaker, spec: PipelineSpec, plan: FailParent) -> None:
    """An item failed for good: the await step fails, and with it the run's execution.
    A child step's children still open are cancelled; a chain's run fails once their
    outcomes are in (its stop waits for them: ``waits.stop_held_by_children``), a
    graph's node fails at once (their outcomes are recorded, and change nothing)."""
    state = maker.current
    if state.boundary.kind == "child":
        children.cancel_children(maker, state, "failed")
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
    if spec.graph is not None:  # the graph step failed: a handler, skips or the outcome
        graph_run.failed(maker, spec, step)
        return
    if waits.children_open(maker.current):  # the unwind begins once they are all in
        control.request_stop(maker, spec, "failed", plan.error)
        return
    control.fail_execution(maker, spec, error=plan.error)


def _release(maker: FactMaker, spec: PipelineSpec, released: bytes) -> None:
    """The await step completes with the boundary's output; the next segment begins."""
    state = maker.current
    await_step = state.boundary.step
    assert await_step is not None
    continue_after(maker, spec, boundary=state.boundary.number, step=await_step, output=released)


def timeout_interaction(
    maker: FactMaker, spec: PipelineSpec, ctx: Context, interaction_id: str
) -> None:
    """InteractionTimedOut for an open interaction, then whatever the boundary does next:
    nothing if the run is stopping (a stopping parent only waits for its children to
    settle; ``control.settle_stop`` goes on from there)."""
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
    if not maker.current.stopping:
        apply_plan(maker, spec, ctx, _plan(maker, spec))
