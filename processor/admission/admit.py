"""The shared boundary-admission stage: one transport-agnostic function.

Checks, in order: the token and the interaction it names, duplicates and
conflicts, a terminal run, the deadline. Then the continuation planner decides.
A completion at or after its interaction's deadline loses to the timeout in
whichever order the two are processed: it is refused, and the timeout commits.
"""

from __future__ import annotations

from processor.admission import signals
from processor.admission.arrivals import Arrival
from processor.facts import keys, payload, tokens
from processor.facts.models import (
    BoundaryCompletionAdmitted,
    BoundaryDispatchCompleted,
    BoundaryInteractionDispatched,
    ContinuationSegmentCreated,
    SegmentSuspended,
)
from processor.model import control, waits
from processor.model.decide import (
    Context,
    Decision,
    FactMaker,
    continue_boundary,
    start_attempt,
    start_run,
    timeout_interaction,
)
from processor.model.pipeline_spec import PipelineSpec
from processor.model.state import Interaction, RunState

__all__ = ["admit"]

START_INTERACTION = keys.interaction_id(0, 0)


def admit(arrival: Arrival, state: RunState | None, ctx: Context) -> Decision:
    """Admit one completion or handoff into its boundary, or refuse it with a reason."""
    too_large = payload.oversize(arrival.payload, ctx.max_payload_bytes, _what_payload(arrival))
    if too_large is not None:  # refused whole, kept in admission.rejected
        return Decision.refuse("payload_too_large", too_large)
    if arrival.start_pipeline is not None:
        return _admit_start(arrival, state, ctx)
    if state is None:
        reason = "unknown_run" if arrival.event is not None else "unknown_interaction"
        return Decision.refuse(reason, f"no run {arrival.run_id}")
    found = _interaction(arrival, state)
    if found is None and arrival.event is not None:
        return Decision.refuse(*signals.event_refusal(arrival, state))
    if found is None:
        return Decision.refuse(
            "unknown_interaction", _what(arrival) + " is not a known interaction"
        )
    interaction_id, interaction = found
    if arrival.token is not None and tokens.digest(arrival.token) != interaction.token_digest:
        return Decision.refuse("invalid_token", "token is not the current one for its interaction")
    if interaction.status == "admitted":
        if interaction.digest == arrival.digest:
            return Decision()  # an identical duplicate: nothing new
        return Decision.refuse(
            "conflicting_completion", f"{interaction_id} was already admitted with another payload"
        )
    if state.terminal:
        return Decision.refuse("run_terminal", f"run {state.run_id} is already {state.status}")
    if interaction.status == "timed_out":
        return Decision.refuse("late_completion", f"{interaction_id} already timed out")
    spec = ctx.catalog.get(state.pipeline, state.pipeline_version)
    if spec is None:
        detail = f"pipeline {state.pipeline!r} v{state.pipeline_version} is not loaded"
        return Decision.refuse("unknown_pipeline", detail)
    # A graph run's await step waits in its lane, whose boundary its segment numbers.
    lane = state.lane_of(interaction.boundary)
    maker = FactMaker(
        state, state.run_id, ctx.now, arrival.cause_id, live=ctx.live_versions, lane=lane
    )
    control.deadline_first(maker, spec)
    # Stop intent closed the run's interactions, but for the children a stopping parent
    # waits for (``waits.children_open``): their outcomes are recorded, not continued.
    awaited = (
        maker.current.stopping and interaction.kind == "child" and waits.held_by_stop(maker.current)
    )
    if maker.current.stopping and not awaited:
        control.settle_stop(maker, spec)
        return maker.decision("run_terminal", f"run {state.run_id} is stopping")
    if 0 < interaction.deadline_ms <= ctx.now:
        timeout_interaction(maker, spec, ctx, interaction_id)  # the deadline wins
        if awaited:
            control.settle_stop(maker, spec)
        detail = f"{interaction_id} deadline {interaction.deadline_ms} passed (now {ctx.now})"
        return maker.decision("late_completion", detail)
    _admitted(maker, arrival, interaction_id, interaction)
    if awaited:
        control.settle_stop(maker, spec)  # the last child's outcome begins the unwind
    else:
        continue_boundary(maker, spec, ctx)
    return maker.decision()


def _what_payload(arrival: Arrival) -> str:
    return {"await": "completion payload", "event": "event payload"}.get(
        arrival.source, "handoff payload"
    )


def _what(arrival: Arrival) -> str:
    if arrival.claims is not None:
        return f"{arrival.claims.interaction} of run {arrival.run_id}"
    return f"checkpoint {arrival.checkpoint!r} for run {arrival.run_id}"


def _interaction(arrival: Arrival, state: RunState) -> tuple[str, Interaction] | None:
    if arrival.event is not None:
        return signals.event_interaction(arrival, state)
    if arrival.claims is not None:
        found = state.interactions.get(arrival.claims.interaction)
        return None if found is None else (arrival.claims.interaction, found)
    candidates = [
        (key, i)
        for key, i in state.interactions.items()
        if i.kind == "checkpoint" and i.target == arrival.checkpoint and i.boundary > 0
    ]
    open_ones = [c for c in candidates if c[1].status == "open"]
    pool = open_ones or candidates
    return max(pool, key=lambda c: c[1].boundary) if pool else None


def _admitted(
    maker: FactMaker, arrival: Arrival, interaction_id: str, interaction: Interaction
) -> None:
    maker.add(
        BoundaryCompletionAdmitted(
            **maker.header(keys.interaction_admitted(interaction_id)),
            boundary=interaction.boundary,
            interaction=interaction_id,
            item_index=interaction.item_index,
            source=arrival.source,
            outcome=arrival.outcome,
            payload=arrival.payload,
            content_type=arrival.content_type,
            error=arrival.error,
            idempotency_key=arrival.idempotency_key,
            payload_digest=arrival.digest,
        )
    )


def _admit_start(arrival: Arrival, state: RunState | None, ctx: Context) -> Decision:
    """A handoff to ``pipeline:<name>`` starts a run at boundary 0, admitted at once."""
    if state is not None:
        start = state.interactions.get(START_INTERACTION)
        if start is not None and start.digest == arrival.digest:
            return Decision()
        return Decision.refuse(
            "conflicting_completion", f"run {state.run_id} was started by another handoff"
        )
    assert arrival.start_pipeline is not None
    spec = ctx.catalog.latest(arrival.start_pipeline)
    if spec is None:
        return Decision.refuse("unknown_pipeline", f"no pipeline named {arrival.start_pipeline!r}")
    maker = FactMaker(None, arrival.run_id, ctx.now, arrival.cause_id, live=ctx.live_versions)
    start_run(
        maker,
        spec,
        canonical_input=arrival.payload,
        idempotency_key=arrival.idempotency_key,
        fingerprint=payload.submit_fingerprint(spec.name, arrival.payload),
        submitted_ms=ctx.now,
    )
    _start_boundary(maker, arrival)
    _admitted(maker, arrival, START_INTERACTION, maker.current.interactions[START_INTERACTION])
    _continue_from_start(maker, spec, arrival.payload)
    return maker.decision()


def _start_boundary(maker: FactMaker, arrival: Arrival) -> None:
    checkpoint = arrival.checkpoint or ""
    maker.add(
        SegmentSuspended(
            **maker.header(keys.boundary_suspended(0)),
            segment=0,
            attempt=0,
            generation=0,
            step=0,
            boundary=0,
            kind="checkpoint",
            target=checkpoint,
            itemized=False,
            items=1,
            on_timeout="fail",
        )
    )
    maker.add(
        BoundaryInteractionDispatched(
            **maker.header(keys.interaction_dispatched(START_INTERACTION)),
            boundary=0,
            interaction=START_INTERACTION,
            item_index=0,
            target=checkpoint,
            request=b"",
            deadline_ms=0,
            token_digest=b"",
            epoch=0,
        )
    )
    maker.add(
        BoundaryDispatchCompleted(
            **maker.header(keys.boundary_dispatched(0)), boundary=0, interactions=1
        )
    )


def _continue_from_start(maker: FactMaker, spec: PipelineSpec, first_input: bytes) -> None:
    maker.add(
        ContinuationSegmentCreated(
            **maker.header(keys.boundary_continued(0)),
            boundary=0,
            segment=1,
            first_step=0,
            input=first_input,
        )
    )
    start_attempt(maker, spec, segment=1, attempt=1, generation=1, first_step=0, input=first_input)
