"""The attempt lifecycle, one for both kinds: forward segments and compensators.

An attempt starts (a started fact, a work item with its expiry), is reported started
by a worker (``progress``: its timeouts run from then), runs until its result or its
timeout, and may fail into a retry wait whose timer starts the next attempt with the
next generation. A result is the current attempt's if it names the running attempt,
or the Unknown one it settles late. What differs between the kinds (the started fact,
the timeout armed at the start, the timer kinds in ``due.ATTEMPT_TIMERS``) is chosen
by kind where it differs; the lifecycle itself is written once here. None of it reads
a clock or does I/O.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from processor.facts import keys
from processor.facts.models import (
    AttemptOutcomeUnknown,
    CompensationAttemptStarted,
    RunDefinitionBlocked,
    SegmentAttemptStarted,
    WorkItem,
)
from processor.facts.topics import TopicName
from processor.model import waits
from processor.model.decision import FactMaker
from processor.model.due import DueEntry
from processor.model.pipeline_spec import PipelineSpec, RetryPolicy
from processor.model.state import FORWARD, Attempt, AttemptKind, RunState

__all__ = [
    "NO_EXPIRY",
    "RetryDecision",
    "block",
    "expired",
    "is_current",
    "mark_unknown",
    "retry_decision",
    "retry_due",
    "retry_due_ms",
    "start",
    "start_next",
    "started_timeout_ms",
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
    forward attempt that no live worker could run waits instead (``block``).

    Neither kind's timer counts the queue: at dispatch it is the first step's
    schedule-to-start timeout, if it has one, else none; the start-to-close timer (a
    compensator's: its compensation timeout) is armed when a worker reports the start
    (``progress``).
    """
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
    timeout = spec.steps[first_step].schedule_to_start_timeout_ms
    expires_ms = None if timeout is None else maker.now + timeout
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
    # A finally step runs after a deadline too: the deadline does not bound it.
    deadline_ms = None if spec.outlives_deadline(first_step) else maker.current.deadline_ms
    item = WorkItem(
        run_id=maker.run_id,
        pipeline=spec.name,
        pipeline_version=spec.version,
        segment=scope,
        attempt=number,
        generation=generation,
        first_step=first_step,
        input=input,
        expires_ms=_start_by(kind, expires_ms, deadline_ms),
        kind=kind,
        run_deadline_ms=deadline_ms,
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


#: A work item's ``expires_ms`` when nothing bounds its start (the largest Avro long).
NO_EXPIRY = 2**63 - 1


def _start_by(kind: AttemptKind, expires_ms: int | None, deadline_ms: int | None) -> int:
    """The work item's ``expires_ms``: the latest time to start it (schedule-to-start
    expiry, else the run deadline, else never). The run deadline bounds forward work
    only: a compensator is recovery, often dispatched because the deadline passed."""
    if expires_ms is not None:
        return expires_ms
    return NO_EXPIRY if deadline_ms is None or kind != FORWARD else deadline_ms


def started_timeout_ms(spec: PipelineSpec, kind: AttemptKind, step: int) -> int:
    """The timeout armed when a worker reports ``step`` started: the start-to-close one of a
    forward attempt, a compensator's compensation timeout."""
    if kind == FORWARD:
        return spec.started_timeout_ms(step)
    compensation = spec.steps[step].compensation
    assert compensation is not None  # only a step with a compensator is compensated
    return compensation.timeout_ms


#: Retry reasons (README: retry reasons): why a failure is tried again, or why not.
ELIGIBLE = "eligible"  # retryable, and the policy allows another attempt
NO_POLICY = "no_policy"  # the step's policy allows one attempt only (max_attempts=1)
ATTEMPTS_EXHAUSTED = "attempts_exhausted"  # the policy's max_attempts were made
NON_RETRYABLE = "non_retryable"  # the step said so (NonRetryableError, a bad output)


@dataclass(frozen=True, slots=True)
class RetryDecision:
    """Whether a failed attempt is tried again: when (None: never), and why."""

    due_ms: int | None
    reason: str


def retry_decision(
    policy: RetryPolicy, attempts_made: int, retryable: bool, now: int
) -> RetryDecision:
    """The retry decision after a failure, by the policy, with its reason."""
    if not retryable:
        return RetryDecision(None, NON_RETRYABLE)
    if policy.max_attempts == 1:
        return RetryDecision(None, NO_POLICY)
    if not policy.allows_another(attempts_made):
        return RetryDecision(None, ATTEMPTS_EXHAUSTED)
    return RetryDecision(now + policy.backoff_ms(attempts_made), ELIGIBLE)


def retry_due_ms(policy: RetryPolicy, attempts_made: int, retryable: bool, now: int) -> int | None:
    """When the next attempt after a failure starts, or None if the policy gives up."""
    return retry_decision(policy, attempts_made, retryable, now).due_ms


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
    if waits.of(state) is waits.UNKNOWN and unknown is not None and unknown.kind == kind:
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
