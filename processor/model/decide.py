"""Decide: from the run projection, one input and the time, to facts and messages.

Pure: no I/O, no clock reads. Refusals are values (``Decision.refusal``), never
exceptions, and a refused input changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from processor.facts import keys
from processor.facts.models import (
    AvroModel,
    CommandReply,
    DeadLetter,
    FactHeader,
    RetryScheduled,
    RunFailed,
    RunOutcome,
    RunSubmitted,
    RunSucceeded,
    SegmentAttemptStarted,
    SegmentCompleted,
    SegmentFailed,
    SegmentResult,
    StepCompleted,
    SubmitRun,
    WorkItem,
)
from processor.facts.payload import (
    InvalidPayloadError,
    canonical_json,
    derive_run_id,
    submit_fingerprint,
)
from processor.facts.topics import TopicName
from processor.model.due import DueEntry
from processor.model.pipeline_spec import PipelineSpec
from processor.model.state import RunState

__all__ = [
    "Decision",
    "Emit",
    "PipelineCatalog",
    "TimerFired",
    "decide_result",
    "decide_submit",
    "decide_timer",
]

ATTEMPT_TIMEOUT = "attempt_timeout"


class PipelineCatalog(Protocol):
    """The pipelines the processor knows, by name and version."""

    def latest(self, name: str) -> PipelineSpec | None: ...

    def get(self, name: str, version: int) -> PipelineSpec | None: ...


@dataclass(frozen=True, slots=True)
class TimerFired:
    """A due-work row whose time has come."""

    entry: DueEntry

    @property
    def cause_id(self) -> str:
        e = self.entry
        return f"timer/{e.kind}/{e.run_id}/{e.segment}/{e.generation}"


@dataclass(frozen=True, slots=True)
class Emit:
    """A message to produce in the same transaction as the facts."""

    topic: TopicName
    key: str
    value: AvroModel


@dataclass(frozen=True, slots=True)
class Decision:
    """What one input did: facts to append against ``expected_version``, messages to send."""

    expected_version: int = 0
    facts: tuple[FactHeader, ...] = ()
    emits: tuple[Emit, ...] = ()
    refusal: str | None = None
    detail: str = ""

    @staticmethod
    def refuse(reason: str, detail: str, *emits: Emit) -> Decision:
        return Decision(refusal=reason, detail=detail, emits=emits)


@dataclass
class _FactMaker:
    """Stamps facts with the run id, the next sequence numbers, time and cause."""

    run_id: str
    version: int
    now: int
    cause_id: str
    facts: list[FactHeader] = field(default_factory=list)

    def add(self, fact_type: type[FactHeader], fact_key: str, **body: Any) -> None:
        self.facts.append(
            fact_type(
                run_id=self.run_id,
                seq=self.version + len(self.facts) + 1,
                fact_key=fact_key,
                time_ms=self.now,
                cause_id=self.cause_id,
                **body,
            )
        )


# --- submit -------------------------------------------------------------------------------


def decide_submit(
    command: SubmitRun, existing: RunState | None, catalog: PipelineCatalog, now: int
) -> Decision:
    """Accept a new run, return the original one for an identical keyed retry, or refuse."""
    reply = _replier(command)
    spec = catalog.latest(command.pipeline)
    if spec is None:
        return Decision.refuse(
            "unknown_pipeline",
            f"no pipeline named {command.pipeline!r}",
            reply(False, "unknown_pipeline"),
        )
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
        fingerprint = submit_fingerprint(command.pipeline, canonical_input)
    if existing is not None:
        return _resubmitted(command, existing, fingerprint, reply)
    maker = _FactMaker(command.run_id, 0, now, command.command_id)
    maker.add(
        RunSubmitted,
        keys.SUBMITTED,
        pipeline=spec.name,
        pipeline_version=spec.version,
        input=canonical_input,
        idempotency_key=command.idempotency_key,
        fingerprint=fingerprint,
        submitted_ms=command.submitted_ms,
    )
    work = _start_attempt(
        maker, spec, segment=1, attempt=1, generation=1, first_step=0, input=canonical_input
    )
    return Decision(0, tuple(maker.facts), (work, reply(True)))


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


def decide_result(
    result: SegmentResult, state: RunState | None, catalog: PipelineCatalog, now: int
) -> Decision:
    """Accept the current attempt's result; refuse stale or malformed ones untouched."""
    if state is None:
        return Decision.refuse("unknown_run", f"no run {result.run_id}")
    if (
        state.terminal
        or state.phase != "dispatched"
        or (
            (result.segment, result.attempt, result.generation)
            != (state.segment, state.attempt, state.generation)
        )
    ):
        detail = (
            f"result for segment {result.segment} attempt {result.attempt} generation "
            f"{result.generation}; run is {state.status}, phase {state.phase}, segment "
            f"{state.segment} attempt {state.attempt} generation {state.generation}"
        )
        return Decision.refuse("stale_attempt", detail)
    spec = catalog.get(state.pipeline, state.pipeline_version)
    if spec is None:
        detail = f"pipeline {state.pipeline!r} version {state.pipeline_version} is not loaded"
        return Decision.refuse("unknown_pipeline", detail)
    problem = _result_problem(result, state, spec)
    if problem:
        return Decision.refuse("malformed_result", problem)
    maker = _FactMaker(state.run_id, state.version, now, result.result_id)
    for done in result.steps:
        common = {
            "segment": state.segment,
            "attempt": state.attempt,
            "generation": state.generation,
        }
        maker.add(
            StepCompleted,
            keys.step_completed(done.step),
            step=done.step,
            output=done.output,
            **common,
        )
    if result.outcome == "completed":
        return _segment_completed(maker, state, spec, result)
    step = result.failed_step if result.failed_step is not None else state.next_step
    return _segment_failed(
        maker,
        state,
        spec,
        step=step,
        error=result.error or "",
        error_type=result.error_type or "Error",
        retryable=result.retryable,
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
    if result.outcome == "completed" and reached != spec.last_step + 1:
        return f"completed result stops at step {reached - 1}, pipeline ends at {spec.last_step}"
    if result.outcome == "failed" and result.failed_step not in (None, reached):
        return (
            f"failed_step {result.failed_step} is not the step after the completed ones ({reached})"
        )
    if result.outcome == "failed" and reached > spec.last_step:
        return "failed result after every step completed"
    return ""


def _segment_completed(
    maker: _FactMaker, state: RunState, spec: PipelineSpec, result: SegmentResult
) -> Decision:
    maker.add(
        SegmentCompleted,
        keys.segment_completed(state.segment),
        segment=state.segment,
        attempt=state.attempt,
        generation=state.generation,
        last_step=spec.last_step,
    )
    output = result.steps[-1].output if result.steps else state.last_output
    maker.add(RunSucceeded, keys.TERMINAL, result=output)
    outcome = RunOutcome(
        run_id=state.run_id,
        pipeline=state.pipeline,
        status="succeeded",
        result=output,
        submitted_ms=state.submitted_ms,
        finished_ms=maker.now,
    )
    return Decision(
        state.version, tuple(maker.facts), (Emit(TopicName.OUTCOMES, state.run_id, outcome),)
    )


def _segment_failed(
    maker: _FactMaker,
    state: RunState,
    spec: PipelineSpec,
    *,
    step: int,
    error: str,
    error_type: str,
    retryable: bool,
) -> Decision:
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
    # A result that completed steps before failing reset the budget to this attempt alone.
    attempts_made = 1 if step > state.next_step else state.step_attempts
    policy = spec.steps[step].retry
    if retryable and policy.allows_another(attempts_made):
        maker.add(
            RetryScheduled,
            keys.retry_scheduled(state.segment, state.generation),
            segment=state.segment,
            attempt=state.attempt + 1,
            due_ms=maker.now + policy.backoff_ms(attempts_made),
        )
        return Decision(state.version, tuple(maker.facts))
    maker.add(
        RunFailed,
        keys.TERMINAL,
        error=error,
        error_type=error_type,
        step=step,
        attempts=attempts_made,
    )
    return Decision(
        state.version,
        tuple(maker.facts),
        _failure_emits(
            state,
            step=step,
            attempts=attempts_made,
            error=error,
            error_type=error_type,
            now=maker.now,
        ),
    )


def _failure_emits(
    state: RunState, *, step: int, attempts: int, error: str, error_type: str, now: int
) -> tuple[Emit, ...]:
    dead = DeadLetter(
        run_id=state.run_id,
        pipeline=state.pipeline,
        pipeline_version=state.pipeline_version,
        input=state.input,
        step=step,
        attempts=attempts,
        error=error,
        error_type=error_type,
        failed_ms=now,
    )
    outcome = RunOutcome(
        run_id=state.run_id,
        pipeline=state.pipeline,
        status="failed",
        error=error,
        submitted_ms=state.submitted_ms,
        finished_ms=now,
    )
    return (
        Emit(TopicName.DLQ, state.run_id, dead),
        Emit(TopicName.OUTCOMES, state.run_id, outcome),
    )


# --- timers -------------------------------------------------------------------------------


def decide_timer(
    timer: TimerFired, state: RunState | None, catalog: PipelineCatalog, now: int
) -> Decision:
    """Turn a due row into facts, if the run still waits on it; otherwise do nothing."""
    entry = timer.entry
    if state is None or state.terminal or state.generation != entry.generation:
        return Decision()
    spec = catalog.get(state.pipeline, state.pipeline_version)
    if spec is None:
        return Decision()  # kept due: it fires again once the pipeline version is loaded
    maker = _FactMaker(state.run_id, state.version, now, timer.cause_id)
    if entry.kind == "attempt_timeout" and state.phase == "dispatched":
        if state.attempt_expires_ms is None or now < state.attempt_expires_ms:
            return Decision()
        error = f"attempt {state.attempt} produced no result before its deadline (worker lost?)"
        return _segment_failed(
            maker,
            state,
            spec,
            step=state.next_step,
            error=error,
            error_type=ATTEMPT_TIMEOUT,
            retryable=True,
        )
    if entry.kind == "retry" and state.phase == "retry_wait":
        if state.retry_due_ms is None or now < state.retry_due_ms:
            return Decision()
        work = _start_attempt(
            maker,
            spec,
            segment=state.segment,
            attempt=state.attempt + 1,
            generation=state.generation + 1,
            first_step=state.next_step,
            input=state.last_output,
        )
        return Decision(state.version, tuple(maker.facts), (work,))
    return Decision()


def _start_attempt(
    maker: _FactMaker,
    spec: PipelineSpec,
    *,
    segment: int,
    attempt: int,
    generation: int,
    first_step: int,
    input: bytes,
) -> Emit:
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
    work = WorkItem(
        run_id=maker.run_id,
        pipeline=spec.name,
        pipeline_version=spec.version,
        segment=segment,
        attempt=attempt,
        generation=generation,
        first_step=first_step,
        input=input,
        expires_ms=expires_ms,
    )
    return Emit(TopicName.WORK, maker.run_id, work)
