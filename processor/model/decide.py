"""Decide: from the run projection, one input and the time, to facts and messages.

Pure: no I/O, no clock reads. Refusals are values (``Decision.refusal``), never
exceptions, and a refused input changes nothing (except a late completion, which
lets the timeout it lost to commit in the same decision).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from processor.admission import tokens
from processor.facts import keys, payload
from processor.facts.models import (
    AvroModel,
    BoundaryDispatchCompleted,
    BoundaryInteractionDispatched,
    BoundaryRequest,
    CheckpointHandoff,
    CommandReply,
    ContinuationSegmentCreated,
    DeadLetter,
    FactHeader,
    InteractionTimedOut,
    RetryScheduled,
    RunFailed,
    RunOutcome,
    RunSubmitted,
    RunSucceeded,
    SegmentAttemptStarted,
    SegmentCompleted,
    SegmentFailed,
    SegmentResult,
    SegmentSuspended,
    StepCompleted,
    SubmitRun,
    TerminalPublicationCompleted,
    TerminalPublicationPrepared,
    WorkItem,
)
from processor.facts.payload import InvalidPayloadError, canonical_json, derive_run_id
from processor.facts.topics import TopicName
from processor.model.due import DueEntry
from processor.model.pipeline_spec import AwaitSpec, PipelineSpec
from processor.model.reduce import reduce
from processor.model.state import RunState
from processor.runtime.continuation import (
    FailParent,
    Plan,
    ReleaseItemized,
    ReleaseScalar,
    plan_continuation,
)

__all__ = [
    "Context",
    "Decision",
    "Emit",
    "FactMaker",
    "PipelineCatalog",
    "Publish",
    "TimerFired",
    "apply_plan",
    "decide_result",
    "decide_submit",
    "decide_timer",
    "start_run",
]

ATTEMPT_TIMEOUT = "attempt_timeout"


class PipelineCatalog(Protocol):
    """The pipelines the processor knows, by name and version."""

    def latest(self, name: str) -> PipelineSpec | None: ...

    def get(self, name: str, version: int) -> PipelineSpec | None: ...


@dataclass(frozen=True, slots=True)
class Context:
    """What every decision may depend on besides the run: pipelines, time, token secret."""

    catalog: PipelineCatalog
    now: int
    secret: bytes = b""


@dataclass(frozen=True, slots=True)
class TimerFired:
    """A due-work row whose time has come."""

    entry: DueEntry

    @property
    def cause_id(self) -> str:
        e = self.entry
        return f"timer/{e.kind}/{e.run_id}/{e.scope}/{e.ordinal}"


@dataclass(frozen=True, slots=True)
class Emit:
    """A message to produce in the same transaction as the facts."""

    topic: TopicName
    key: str
    value: AvroModel


@dataclass(frozen=True, slots=True)
class Publish:
    """An external effect performed and confirmed *before* the decision commits.

    Terminal publication: a crash after it and before the commit publishes again
    with the same idempotency key.
    """

    topic: str | TopicName
    key: str
    value: bytes
    headers: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True)
class Decision:
    """What one input did: facts to append against ``expected_version``, messages to send."""

    expected_version: int = 0
    facts: tuple[FactHeader, ...] = ()
    emits: tuple[Emit, ...] = ()
    refusal: str | None = None
    detail: str = ""
    effects: tuple[Publish, ...] = ()

    @staticmethod
    def refuse(reason: str, detail: str, *emits: Emit) -> Decision:
        return Decision(refusal=reason, detail=detail, emits=emits)


@dataclass
class FactMaker:
    """Stamps facts with the run id, the next sequence numbers, time and cause.

    It also folds them, so later decisions in the same input see earlier ones.
    """

    state: RunState | None
    run_id: str
    now: int
    cause_id: str
    facts: list[FactHeader] = field(default_factory=list)
    emits: list[Emit] = field(default_factory=list)
    effects: list[Publish] = field(default_factory=list)
    _folded: RunState | None = None

    def __post_init__(self) -> None:
        self._folded = self.state

    @property
    def base_version(self) -> int:
        return self.state.version if self.state is not None else 0

    @property
    def current(self) -> RunState:
        """The run with every fact added so far folded in."""
        assert self._folded is not None, "facts before RunSubmitted"
        return self._folded

    def add(self, fact_type: type[FactHeader], fact_key: str, **body: Any) -> None:
        fact = fact_type(
            run_id=self.run_id,
            seq=self.base_version + len(self.facts) + 1,
            fact_key=fact_key,
            time_ms=self.now,
            cause_id=self.cause_id,
            **body,
        )
        self.facts.append(fact)
        self._folded = reduce(self._folded, fact)

    def emit(self, topic: TopicName, value: AvroModel) -> None:
        self.emits.append(Emit(topic, self.run_id, value))

    def decision(self, refusal: str | None = None, detail: str = "") -> Decision:
        return Decision(
            self.base_version,
            tuple(self.facts),
            tuple(self.emits),
            refusal,
            detail,
            tuple(self.effects),
        )


# --- submit -------------------------------------------------------------------------------


def decide_submit(command: SubmitRun, existing: RunState | None, ctx: Context) -> Decision:
    """Accept a new run, return the original one for an identical keyed retry, or refuse."""
    reply = _replier(command)
    spec = ctx.catalog.latest(command.pipeline)
    if spec is None:
        detail = f"no pipeline named {command.pipeline!r}"
        return Decision.refuse("unknown_pipeline", detail, reply(False, "unknown_pipeline", detail))
    try:
        canonical_input = canonical_json(command.input)
    except InvalidPayloadError as exc:
        return Decision.refuse("invalid_input", str(exc), reply(False, "invalid_input", str(exc)))
    fingerprint = None
    if command.idempotency_key is not None:
        if command.run_id != derive_run_id(command.idempotency_key):
            detail = "run_id must be derived from the idempotency key (processor.facts.payload)"
            return Decision.refuse(
                "invalid_command", detail, reply(False, "invalid_command", detail)
            )
        fingerprint = payload.submit_fingerprint(command.pipeline, canonical_input)
    if existing is not None:
        return _resubmitted(command, existing, fingerprint, reply)
    maker = FactMaker(None, command.run_id, ctx.now, command.command_id)
    start_run(
        maker,
        spec,
        canonical_input=canonical_input,
        idempotency_key=command.idempotency_key,
        fingerprint=fingerprint,
        submitted_ms=command.submitted_ms,
    )
    start_attempt(
        maker, spec, segment=1, attempt=1, generation=1, first_step=0, input=canonical_input
    )
    maker.emits.append(reply(True))
    return maker.decision()


def start_run(
    maker: FactMaker,
    spec: PipelineSpec,
    *,
    canonical_input: bytes,
    idempotency_key: str | None,
    fingerprint: str | None,
    submitted_ms: int,
) -> None:
    maker.add(
        RunSubmitted,
        keys.SUBMITTED,
        pipeline=spec.name,
        pipeline_version=spec.version,
        input=canonical_input,
        idempotency_key=idempotency_key,
        fingerprint=fingerprint,
        submitted_ms=submitted_ms,
    )


def _resubmitted(
    command: SubmitRun,
    existing: RunState,
    fingerprint: str | None,
    reply: Callable[..., Emit],
) -> Decision:
    if command.idempotency_key is not None and existing.fingerprint == fingerprint:
        return Decision(emits=(reply(False),))
    if command.idempotency_key is None and existing.submit_command_id == command.command_id:
        return Decision(emits=(reply(False),))  # the same command delivered again
    if command.idempotency_key is not None:
        detail = f"idempotency key {command.idempotency_key!r} was used with different fields"
        return Decision.refuse(
            "idempotency_conflict", detail, reply(False, "idempotency_conflict", detail)
        )
    detail = f"run {command.run_id} already exists"
    return Decision.refuse("run_exists", detail, reply(False, "run_exists", detail))


def _replier(command: SubmitRun) -> Callable[..., Emit]:
    def reply(created: bool, refusal: str | None = None, detail: str | None = None) -> Emit:
        value = CommandReply(
            command_id=command.command_id,
            run_id=command.run_id,
            created=created,
            refusal=refusal,
            detail=detail,
        )
        return Emit(TopicName.REPLIES, command.run_id, value)

    return reply


# --- worker results -----------------------------------------------------------------------


def decide_result(result: SegmentResult, state: RunState | None, ctx: Context) -> Decision:
    """Accept the current attempt's result; refuse stale or malformed ones untouched."""
    if state is None:
        return Decision.refuse("unknown_run", f"no run {result.run_id}")
    if (
        state.terminal
        or state.phase != "dispatched"
        or (result.segment, result.attempt, result.generation)
        != (state.segment, state.attempt, state.generation)
    ):
        detail = (
            f"result for segment {result.segment} attempt {result.attempt} generation "
            f"{result.generation}; run is {state.status}, phase {state.phase}, segment "
            f"{state.segment} attempt {state.attempt} generation {state.generation}"
        )
        return Decision.refuse("stale_attempt", detail)
    spec = ctx.catalog.get(state.pipeline, state.pipeline_version)
    if spec is None:
        detail = f"pipeline {state.pipeline!r} version {state.pipeline_version} is not loaded"
        return Decision.refuse("unknown_pipeline", detail)
    problem = _result_problem(result, state, spec)
    if problem:
        return Decision.refuse("malformed_result", problem)
    maker = FactMaker(state, state.run_id, ctx.now, result.result_id)
    for done in result.steps:
        _step_completed(maker, state, done.step, done.output)
    if result.outcome == "completed":
        maker.add(
            SegmentCompleted,
            keys.segment_completed(state.segment),
            segment=state.segment,
            attempt=state.attempt,
            generation=state.generation,
            last_step=spec.last_step,
        )
        finish_success(maker, spec)
    elif result.outcome == "suspended":
        _suspend(maker, spec, result, ctx)
    else:
        step = result.failed_step if result.failed_step is not None else state.next_step
        _segment_failed(
            maker,
            spec,
            step=step,
            error=result.error or "",
            error_type=result.error_type or "Error",
            retryable=result.retryable,
        )
    return maker.decision()


def _step_completed(maker: FactMaker, state: RunState, step: int, output: bytes) -> None:
    maker.add(
        StepCompleted,
        keys.step_completed(step),
        segment=state.segment,
        attempt=state.attempt,
        generation=state.generation,
        step=step,
        output=output,
    )


def _result_problem(result: SegmentResult, state: RunState, spec: PipelineSpec) -> str:
    expected = list(range(state.next_step, state.next_step + len(result.steps)))
    if [s.step for s in result.steps] != expected:
        return f"steps {[s.step for s in result.steps]} do not continue from step {state.next_step}"
    for step in result.steps:
        try:
            canonical_json(step.output)
        except InvalidPayloadError as exc:
            return f"step {step.step} output: {exc}"
    reached = state.next_step + len(result.steps)
    end = spec.segment_end(state.next_step)
    if result.outcome == "completed" and (reached != spec.last_step + 1 or end != spec.last_step):
        return f"completed result stops at step {reached - 1}, its segment ends at {end}"
    if result.outcome == "suspended":
        return _suspension_problem(result, spec, reached, end)
    if result.outcome == "failed" and result.failed_step not in (None, reached):
        return f"failed_step {result.failed_step} is not the step after the completed ones"
    if result.outcome == "failed" and reached > end:
        return "failed result after every step of the segment completed"
    return ""


def _suspension_problem(result: SegmentResult, spec: PipelineSpec, reached: int, end: int) -> str:
    awaits = spec.steps[reached].awaits if reached <= spec.last_step else None
    if reached != end or awaits is None:
        return f"suspended at step {reached}, but the segment's await step is {end}"
    if awaits.kind == "checkpoint" and result.requests:
        return "a checkpoint await sends no requests"
    if awaits.kind == "await" and not awaits.itemized and len(result.requests) != 1:
        return f"a scalar await needs exactly one request, got {len(result.requests)}"
    for index, request in enumerate(result.requests):
        try:
            canonical_json(request)
        except InvalidPayloadError as exc:
            return f"request {index}: {exc}"
    return ""


def _segment_failed(
    maker: FactMaker,
    spec: PipelineSpec,
    *,
    step: int,
    error: str,
    error_type: str,
    retryable: bool,
) -> None:
    state = maker.current
    maker.add(
        SegmentFailed,
        keys.attempt_failed(state.segment, state.generation),
        segment=state.segment,
        attempt=state.attempt,
        generation=state.generation,
        step=step,
        error=error,
        error_type=error_type,
        retryable=retryable,
    )
    attempts_made = state.step_attempts
    policy = spec.steps[step].retry
    if retryable and policy.allows_another(attempts_made):
        maker.add(
            RetryScheduled,
            keys.retry_scheduled(state.segment, state.generation),
            segment=state.segment,
            attempt=state.attempt + 1,
            due_ms=maker.now + policy.backoff_ms(attempts_made),
        )
        return
    fail_run(maker, step=step, attempts=attempts_made, error=error, error_type=error_type)


def fail_run(maker: FactMaker, *, step: int, attempts: int, error: str, error_type: str) -> None:
    """RunFailed, a dead letter on runs.dlq and the outcome on runs.results."""
    state = maker.current
    maker.add(
        RunFailed, keys.TERMINAL, error=error, error_type=error_type, step=step, attempts=attempts
    )
    maker.emit(
        TopicName.DLQ,
        DeadLetter(
            run_id=state.run_id,
            pipeline=state.pipeline,
            pipeline_version=state.pipeline_version,
            input=state.input,
            step=step,
            attempts=attempts,
            error=error,
            error_type=error_type,
            failed_ms=maker.now,
        ),
    )
    maker.emit(
        TopicName.OUTCOMES,
        RunOutcome(
            run_id=state.run_id,
            pipeline=state.pipeline,
            status="failed",
            error=error,
            submitted_ms=state.submitted_ms,
            finished_ms=maker.now,
        ),
    )


def finish_success(maker: FactMaker, spec: PipelineSpec) -> None:
    """Succeed now, or prepare the terminal publication first when the pipeline has one."""
    state = maker.current
    targets = _publication_targets(spec)
    if targets:
        key = f"{state.run_id}/terminal"
        for topic in targets:
            maker.add(
                TerminalPublicationPrepared,
                keys.publication_prepared(topic),
                topic=topic,
                idempotency_key=key,
            )
        return
    _succeed(maker)


def _succeed(maker: FactMaker) -> None:
    state = maker.current
    maker.add(RunSucceeded, keys.TERMINAL, result=state.last_output)
    maker.emit(
        TopicName.OUTCOMES,
        RunOutcome(
            run_id=state.run_id,
            pipeline=state.pipeline,
            status="succeeded",
            result=state.last_output,
            submitted_ms=state.submitted_ms,
            finished_ms=maker.now,
        ),
    )


def _publication_targets(spec: PipelineSpec) -> list[str]:
    targets = []
    if spec.output_topic:
        targets.append(spec.output_topic)
    if spec.checkpoint is not None:
        targets.append(TopicName.CHECKPOINTS.value)
    return targets


# --- boundaries ---------------------------------------------------------------------------


def _suspend(maker: FactMaker, spec: PipelineSpec, result: SegmentResult, ctx: Context) -> None:
    state = maker.current
    step = state.next_step
    awaits = spec.steps[step].awaits
    assert awaits is not None
    boundary = state.segment
    items = 1 if awaits.kind == "checkpoint" else len(result.requests)
    maker.add(
        SegmentSuspended,
        keys.boundary_suspended(boundary),
        segment=state.segment,
        attempt=state.attempt,
        generation=state.generation,
        step=step,
        boundary=boundary,
        kind=awaits.kind,
        target=awaits.target,
        itemized=awaits.itemized,
        items=items,
        on_timeout=awaits.on_timeout,
    )
    requests = result.requests if awaits.kind == "await" else (b"",)
    for index, request in enumerate(requests):
        _dispatch_interaction(maker, awaits, ctx, boundary=boundary, index=index, request=request)
    maker.add(
        BoundaryDispatchCompleted,
        keys.boundary_dispatched(boundary),
        boundary=boundary,
        interactions=items,
    )
    apply_plan(maker, spec, plan_continuation(maker.current))


def _dispatch_interaction(
    maker: FactMaker, awaits: AwaitSpec, ctx: Context, *, boundary: int, index: int, request: bytes
) -> None:
    state = maker.current
    interaction = keys.interaction_id(boundary, index)
    token = tokens.sign(
        ctx.secret, tokens.TokenClaims(state.run_id, boundary, interaction, state.generation)
    )
    deadline = maker.now + awaits.timeout_ms
    canonical = canonical_json(request) if request else b""
    maker.add(
        BoundaryInteractionDispatched,
        keys.interaction_dispatched(interaction),
        boundary=boundary,
        interaction=interaction,
        item_index=index,
        target=awaits.target,
        request=canonical,
        deadline_ms=deadline,
        token_digest=tokens.digest(token),
        epoch=state.generation,
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
        )


def apply_plan(maker: FactMaker, spec: PipelineSpec, plan: Plan) -> None:
    """Turn a continuation plan into facts: release, fail, or keep waiting."""
    if isinstance(plan, ReleaseScalar | ReleaseItemized):
        _release(maker, spec, plan.input)
    elif isinstance(plan, FailParent):
        state = maker.current
        step = state.boundary_step if state.boundary_step is not None else state.next_step
        fail_run(maker, step=step, attempts=1, error=plan.error, error_type=plan.error_type)


def _release(maker: FactMaker, spec: PipelineSpec, released: bytes) -> None:
    """The await step completes with the boundary's output; the next segment begins."""
    state = maker.current
    await_step = state.boundary_step
    assert await_step is not None
    _step_completed(maker, state, await_step, released)
    next_step = await_step + 1
    if next_step > spec.last_step:
        finish_success(maker, spec)
        return
    segment = state.segment + 1
    maker.add(
        ContinuationSegmentCreated,
        keys.boundary_continued(state.boundary),
        boundary=state.boundary,
        segment=segment,
        first_step=next_step,
        input=released,
    )
    start_attempt(
        maker, spec, segment=segment, attempt=1, generation=1, first_step=next_step, input=released
    )


def timeout_interaction(maker: FactMaker, spec: PipelineSpec, interaction_id: str) -> None:
    """InteractionTimedOut for an open interaction, then whatever the boundary does next."""
    interaction = maker.current.interactions[interaction_id]
    maker.add(
        InteractionTimedOut,
        keys.interaction_timed_out(interaction_id),
        boundary=interaction.boundary,
        interaction=interaction_id,
        item_index=interaction.item_index,
        deadline_ms=interaction.deadline_ms,
    )
    apply_plan(maker, spec, plan_continuation(maker.current))


# --- timers -------------------------------------------------------------------------------


def decide_timer(timer: TimerFired, state: RunState | None, ctx: Context) -> Decision:
    """Turn a due row into facts, if the run still waits on it; otherwise do nothing."""
    entry = timer.entry
    if state is None or state.terminal:
        return Decision()
    spec = ctx.catalog.get(state.pipeline, state.pipeline_version)
    if spec is None:
        return Decision()  # kept due: it fires again once the pipeline version is loaded
    maker = FactMaker(state, state.run_id, ctx.now, timer.cause_id)
    if entry.kind == "attempt_timeout":
        _attempt_timed_out(maker, spec, entry)
    elif entry.kind == "retry":
        _retry_due(maker, spec, entry)
    elif entry.kind == "interaction_timeout":
        _interaction_due(maker, spec, keys.interaction_id(entry.scope, entry.ordinal))
    elif entry.kind == "publication" and state.phase == "publishing":
        _publish(maker, spec)
    return maker.decision()


def _interaction_due(maker: FactMaker, spec: PipelineSpec, interaction_id: str) -> None:
    state = maker.current
    interaction = state.interactions.get(interaction_id)
    if interaction is None or interaction.status != "open" or state.phase != "suspended":
        return
    if maker.now >= interaction.deadline_ms:
        timeout_interaction(maker, spec, interaction_id)


def _attempt_timed_out(maker: FactMaker, spec: PipelineSpec, entry: DueEntry) -> None:
    state = maker.current
    if state.phase != "dispatched" or state.generation != entry.ordinal:
        return
    if state.attempt_expires_ms is None or maker.now < state.attempt_expires_ms:
        return
    error = f"attempt {state.attempt} produced no result before its deadline (worker lost?)"
    _segment_failed(
        maker, spec, step=state.next_step, error=error, error_type=ATTEMPT_TIMEOUT, retryable=True
    )


def _retry_due(maker: FactMaker, spec: PipelineSpec, entry: DueEntry) -> None:
    state = maker.current
    if state.phase != "retry_wait" or state.generation != entry.ordinal:
        return
    if state.retry_due_ms is None or maker.now < state.retry_due_ms:
        return
    start_attempt(
        maker,
        spec,
        segment=state.segment,
        attempt=state.attempt + 1,
        generation=state.generation + 1,
        first_step=state.next_step,
        input=state.last_output,
    )


def _publish(maker: FactMaker, spec: PipelineSpec) -> None:
    """Publish the result to every prepared target, then record completion and succeed.

    A target already Completed is skipped; one only Prepared is published again
    with the same deterministic key.
    """
    state = maker.current
    key = state.publication_key or f"{state.run_id}/terminal"
    headers = (
        ("idempotency-key", key.encode()),
        ("run-id", state.run_id.encode()),
        ("content-type", b"application/json"),
    )
    for topic, status in sorted(state.publications.items()):
        if status == "completed":
            continue
        if topic == TopicName.CHECKPOINTS.value and spec.checkpoint is not None:
            maker.effects.append(_checkpoint_publication(state, spec, key, headers))
        else:
            maker.effects.append(Publish(topic, state.run_id, state.last_output, headers))
        maker.add(
            TerminalPublicationCompleted,
            keys.publication_completed(topic),
            topic=topic,
            idempotency_key=key,
        )
    _succeed(maker)


def _checkpoint_publication(
    state: RunState, spec: PipelineSpec, key: str, headers: tuple[tuple[str, bytes], ...]
) -> Publish:
    from processor.facts.codec import encode

    assert spec.checkpoint is not None
    target = spec.checkpoint.target
    handoff_key = f"{state.run_id}/checkpoint/{spec.checkpoint.name}"
    target_run = (
        target.removeprefix("run:") if target.startswith("run:") else derive_run_id(handoff_key)
    )
    handoff = CheckpointHandoff(
        source_run_id=state.run_id,
        checkpoint=spec.checkpoint.name,
        target=target,
        idempotency_key=handoff_key,
        payload=state.last_output,
    )
    return Publish(TopicName.CHECKPOINTS, target_run, encode(handoff), headers)


def start_attempt(
    maker: FactMaker,
    spec: PipelineSpec,
    *,
    segment: int,
    attempt: int,
    generation: int,
    first_step: int,
    input: bytes,
) -> None:
    expires_ms = maker.now + spec.segment_timeout_ms(first_step)
    maker.add(
        SegmentAttemptStarted,
        keys.attempt_started(segment, generation),
        segment=segment,
        attempt=attempt,
        generation=generation,
        first_step=first_step,
        expires_ms=expires_ms,
    )
    maker.emit(
        TopicName.WORK,
        WorkItem(
            run_id=maker.run_id,
            pipeline=spec.name,
            pipeline_version=spec.version,
            segment=segment,
            attempt=attempt,
            generation=generation,
            first_step=first_step,
            input=input,
            expires_ms=expires_ms,
        ),
    )
