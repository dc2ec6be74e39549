"""Forward transitions shared by every decision: attempts, failures, success, publication.

Each function appends facts (and messages) to a FactMaker; none reads a clock or
does I/O.
"""

from __future__ import annotations

from processor.facts import handoff_signature, keys
from processor.facts.codec import encode
from processor.facts.keyring import KeyRing
from processor.facts.models import (
    CheckpointHandoff,
    ContinuationSegmentCreated,
    RetryScheduled,
    RunSubmitted,
    SegmentFailed,
    StepCompleted,
    TerminalPublicationCompleted,
)
from processor.facts.payload import derive_run_id
from processor.facts.topics import TopicName
from processor.model import attempts, control, graph_run
from processor.model.decision import FactMaker, Publish
from processor.model.finish import finish_success, succeed
from processor.model.pipeline_spec import PipelineSpec
from processor.model.state import FORWARD, RunState

__all__ = [
    "STOP_REASONS",
    "continue_after",
    "finish_success",
    "publish",
    "segment_failed",
    "start_attempt",
    "start_run",
    "step_completed",
]


def start_run(
    maker: FactMaker,
    spec: PipelineSpec,
    *,
    canonical_input: bytes,
    idempotency_key: str | None,
    fingerprint: str | None,
    submitted_ms: int,
    deadline_ms: int | None = None,
    traceparent: str | None = None,
) -> None:
    """RunSubmitted, with the deadline of the submit or, failing that, of the pipeline."""
    if deadline_ms is None and spec.deadline_ms is not None:
        deadline_ms = maker.now + spec.deadline_ms
    maker.add(
        RunSubmitted(
            **maker.header(keys.SUBMITTED),
            pipeline=spec.name,
            pipeline_version=spec.version,
            input=canonical_input,
            idempotency_key=idempotency_key,
            fingerprint=fingerprint,
            submitted_ms=submitted_ms,
            deadline_ms=deadline_ms,
            traceparent=traceparent,
        )
    )


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
    """A forward attempt of ``segment`` from ``first_step`` (``attempts.start``)."""
    attempts.start(
        maker,
        spec,
        FORWARD,
        scope=segment,
        number=attempt,
        generation=generation,
        first_step=first_step,
        input=input,
    )


def step_completed(maker: FactMaker, state: RunState, step: int, output: bytes) -> None:
    maker.add(
        StepCompleted(
            **maker.header(keys.step_completed(step)),
            segment=state.attempt.segment,
            attempt=state.attempt.number,
            generation=state.attempt.generation,
            step=step,
            output=output,
        )
    )


#: A failure settled under stop intent is not retried: the retry reason of each stop.
STOP_REASONS = {"timed_out": "deadline_elapsed", "cancelled": "cancelled", "failed": "stopping"}


def segment_failed(
    maker: FactMaker,
    spec: PipelineSpec,
    *,
    step: int,
    error: str,
    error_type: str,
    retryable: bool,
    reason: str | None = None,
) -> None:
    """SegmentFailed, then a retry after backoff, or the run's failure (and unwind).

    The retry decision's reason is recorded on each fact (README: retry reasons);
    ``reason`` overrides the policy's (an operator's declared failure)."""
    state = maker.current
    decision = attempts.retry_decision(
        spec.steps[step].retry, state.attempt.step_attempts, retryable, maker.now
    )
    if state.stopping:
        stop_reason = STOP_REASONS.get(state.stop.reason or "", "stopping")
        decision = attempts.RetryDecision(None, stop_reason)
    elif reason is not None:
        decision = attempts.RetryDecision(None, reason)
    maker.add(
        SegmentFailed(
            **maker.header(keys.attempt_failed(state.attempt.segment, state.attempt.generation)),
            segment=state.attempt.segment,
            attempt=state.attempt.number,
            generation=state.attempt.generation,
            step=step,
            error=error,
            error_type=error_type,
            retryable=retryable,
            reason=decision.reason,
        )
    )
    if maker.current.stopping:
        if spec.graph is not None:  # the step's lane closes; stop intent forbids retries
            graph_run.settle_under_stop(maker, spec, step, "failed")
            return
        control.settle_stop(maker, spec)  # stop intent forbids retries
        return
    if decision.due_ms is not None:
        maker.add(
            RetryScheduled(
                **maker.header(
                    keys.retry_scheduled(state.attempt.segment, state.attempt.generation)
                ),
                segment=state.attempt.segment,
                attempt=state.attempt.number + 1,
                due_ms=decision.due_ms,
                reason=decision.reason,
            )
        )
        return
    if spec.graph is not None:
        graph_run.failed(maker, spec, step)
        return
    control.fail_execution(maker, spec, error=error)


def continue_after(
    maker: FactMaker, spec: PipelineSpec, *, boundary: int, step: int, output: bytes
) -> None:
    """A boundary's step (an await, a sleep) completed with ``output``: the next
    segment begins from the step after it, or the run succeeds after the last step."""
    state = maker.current
    step_completed(maker, state, step, output)
    if spec.graph is not None:  # the graph step's lane closes; the graph goes on
        graph_run.succeeded(maker, spec, step, ())
        return
    next_step = step + 1
    if next_step > spec.last_step:
        finish_success(maker, spec)
        return
    segment = state.attempt.segment + 1
    maker.add(
        ContinuationSegmentCreated(
            **maker.header(keys.boundary_continued(boundary)),
            boundary=boundary,
            segment=segment,
            first_step=next_step,
            input=output,
        )
    )
    start_attempt(
        maker, spec, segment=segment, attempt=1, generation=1, first_step=next_step, input=output
    )


def publish(maker: FactMaker, spec: PipelineSpec, resume_keys: KeyRing) -> None:
    """Publish the result to every prepared target, then record completion and succeed.

    A target already Completed is skipped; one only Prepared is published again
    with the same deterministic key (the loop performs the Publish effects before
    it commits these facts). A checkpoint handoff is signed with ``resume_keys``.
    """
    state = maker.current
    key = state.publication.key or f"{state.run_id}/terminal"
    headers = (
        ("idempotency-key", key.encode()),
        ("run-id", state.run_id.encode()),
        ("content-type", b"application/json"),
    )
    for topic, status in sorted(state.publication.targets.items()):
        if status == "completed":
            continue
        if topic == TopicName.CHECKPOINTS.value and spec.checkpoint is not None:
            maker.effects.append(_checkpoint_publication(state, spec, headers, resume_keys))
        else:
            maker.effects.append(Publish(topic, state.run_id, state.last_output, headers))
        maker.add(
            TerminalPublicationCompleted(
                **maker.header(keys.publication_completed(topic)), topic=topic, idempotency_key=key
            )
        )
    succeed(maker)


def _checkpoint_publication(
    state: RunState,
    spec: PipelineSpec,
    headers: tuple[tuple[str, bytes], ...],
    resume_keys: KeyRing,
) -> Publish:
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
    signed = handoff_signature.signed(resume_keys, handoff)
    return Publish(TopicName.CHECKPOINTS, target_run, encode(signed), headers)
