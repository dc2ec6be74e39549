"""The attempt lifecycle, one for both kinds: forward segments and compensators.

An attempt starts (a started fact, a work item with its expiry), runs until its
result or its timeout, and may fail into a retry wait whose timer starts the next
attempt with the next generation. A result is the current attempt's if it names
the running attempt, or the Unknown one it settles late. What differs between the
kinds (the started fact, the timeout, the timer kinds) is in ``_TRACKS``; the
lifecycle itself is written once here. None of it reads a clock or does I/O.
"""

from __future__ import annotations

import logging

from processor.facts import keys
from processor.facts.models import (
    AttemptOutcomeUnknown,
    CompensationAttemptStarted,
    RunDefinitionBlocked,
    SegmentAttemptStarted,
    WorkItem,
)
from processor.facts.topics import TopicName
from processor.model.decision import FactMaker
from processor.model.due import DueEntry
from processor.model.pipeline_spec import PipelineSpec, RetryPolicy
from processor.model.state import FORWARD, Attempt, AttemptKind, RunState

__all__ = [
    "block",
    "expired",
    "is_current",
    "mark_unknown",
    "retry_due",
    "retry_due_ms",
    "start",
    "start_next",
]

logger = logging.getLogger(__name__)


def start(
    maker: FactMaker,
    spec: PipelineSpec,
    kind: AttemptKind,
    *,
    scope: int,
    number: int,
    generation: int,
    first_step: int,
    input: bytes,
) -> None:
    """The attempt's started fact and the work item that carries it to a worker; a
    forward attempt that no live worker could run waits instead (``block``)."""
    if kind == FORWARD and not maker.loads(spec):
        detail = f"no live worker loads pipeline {spec.name!r} v{spec.version}"
        block(
            maker,
            segment=scope,
            number=number,
            generation=generation,
            first_step=first_step,
            step_attempts=maker.current.attempt.step_attempts,
            reason="no_live_worker",
            detail=detail,
        )
        return
    expires_ms = maker.now + _timeout_ms(spec, kind, first_step)
    if kind == FORWARD:
        maker.add(
            SegmentAttemptStarted(
                **maker.header(keys.attempt_started(scope, generation)),
                segment=scope,
                attempt=number,
                generation=generation,
                first_step=first_step,
                expires_ms=expires_ms,
            )
        )
    else:
        maker.add(
            CompensationAttemptStarted(
                **maker.header(keys.compensation_attempt(scope, generation)),
                step=scope,
                attempt=number,
                generation=generation,
                expires_ms=expires_ms,
            )
        )
    item = WorkItem(
        run_id=maker.run_id,
        pipeline=spec.name,
        pipeline_version=spec.version,
        segment=scope,
        attempt=number,
        generation=generation,
        first_step=first_step,
        input=input,
        expires_ms=expires_ms,
        kind=kind,
        run_deadline_ms=maker.current.deadline_ms,
    )
    maker.emit(TopicName.WORK, item)


def block(
    maker: FactMaker,
    *,
    segment: int,
    number: int,
    generation: int,
    first_step: int,
    step_attempts: int,
    reason: str,
    detail: str,
    worker_id: str | None = None,
) -> None:
    """The forward attempt (``number``, ``generation``) waits, undispatched, for a worker
    that loads the run's version: phase ``definition_blocked``, no timer, nothing charged."""
    maker.add(
        RunDefinitionBlocked(
            **maker.header(keys.definition_blocked(segment, generation)),
            segment=segment,
            attempt=number,
            generation=generation,
            first_step=first_step,
            step_attempts=step_attempts,
            reason=reason,
            worker_id=worker_id,
            detail=detail,
        )
    )
    logger.info(
        "definition_blocked run=%s segment=%d attempt=%d generation=%d reason=%s %s",
        maker.run_id,
        segment,
        number,
        generation,
        reason,
        detail,
    )


def start_next(maker: FactMaker, spec: PipelineSpec, attempt: Attempt) -> None:
    """The attempt after ``attempt`` (its retry): the next number and generation."""
    state = maker.current
    first_step, input = _next_input(state, attempt)
    start(
        maker,
        spec,
        attempt.kind,
        scope=attempt.scope,
        number=attempt.number + 1,
        generation=attempt.generation + 1,
        first_step=first_step,
        input=input,
    )


def _next_input(state: RunState, attempt: Attempt) -> tuple[int, bytes]:
    if attempt.kind == FORWARD:
        return state.attempt.next_step, state.last_output
    return attempt.scope, state.step_outputs.get(attempt.scope, b"null")


def _timeout_ms(spec: PipelineSpec, kind: AttemptKind, first_step: int) -> int:
    if kind == FORWARD:
        return spec.segment_timeout_ms(first_step)
    compensation = spec.steps[first_step].compensation
    assert compensation is not None
    return compensation.timeout_ms


def retry_due_ms(policy: RetryPolicy, attempts_made: int, retryable: bool, now: int) -> int | None:
    """When the next attempt after a failure starts, or None if the policy gives up."""
    if not retryable or not policy.allows_another(attempts_made):
        return None
    return now + policy.backoff_ms(attempts_made)


def expired(state: RunState, kind: AttemptKind, entry: DueEntry, now: int) -> Attempt | None:
    """The running attempt of ``kind`` if the timeout ``entry`` is its and has passed."""
    attempt = state.attempt_of(kind)
    if not attempt.running or attempt.generation != entry.ordinal:
        return None
    if attempt.expires_ms is None or now < attempt.expires_ms:
        return None
    return attempt


def retry_due(state: RunState, kind: AttemptKind, entry: DueEntry, now: int) -> Attempt | None:
    """The waiting attempt of ``kind`` if the retry timer ``entry`` is its and is due."""
    attempt = state.attempt_of(kind)
    if not attempt.waiting or attempt.generation != entry.ordinal:
        return None
    if attempt.retry_due_ms is None or now < attempt.retry_due_ms:
        return None
    return attempt


def is_current(
    state: RunState, kind: AttemptKind, scope: int, number: int, generation: int
) -> bool:
    """Whether a result of (scope, number, generation) is the current attempt's: the
    running one, or the Unknown one whose late result settles it."""
    named = (scope, number, generation)
    attempt = state.attempt_of(kind)
    if attempt.running:
        return named == (attempt.scope, attempt.number, attempt.generation)
    unknown = state.unknown
    if state.phase == "unknown" and unknown is not None and unknown.kind == kind:
        return named == (unknown.segment, unknown.attempt, unknown.generation)
    return False


def mark_unknown(maker: FactMaker, attempt: Attempt, *, step: int) -> None:
    """An effectful attempt lost contact: its outcome is unknown and it is never retried blindly."""
    maker.add(
        AttemptOutcomeUnknown(
            **maker.header(keys.attempt_unknown(attempt.kind, attempt.scope, attempt.generation)),
            kind=attempt.kind,
            segment=attempt.scope,
            attempt=attempt.number,
            generation=attempt.generation,
            step=step,
        )
    )
    logger.warning(
        "remote_outcome_unknown run=%s kind=%s segment=%d attempt=%d generation=%d step=%d "
        "decision=automatic_retry_suppressed",
        maker.run_id,
        attempt.kind,
        attempt.scope,
        attempt.number,
        attempt.generation,
        step,
    )
