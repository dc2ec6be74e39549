"""Attempt progress: the timers that run from a worker's start, heartbeats, lost attempts.

The rules are the same for both kinds of attempt, forward segments and compensators.
An attempt is dispatched with no timer but its first step's schedule-to-start timeout
(time in the queue does not count). A worker's ``started`` report for the current
attempt records ``AttemptStepStarted`` and arms its own timer from then (a forward
attempt's start-to-close, ``PipelineSpec.started_timeout_ms``; a compensator's
compensation timeout, ``CompensationSpec.timeout_ms``) and, for a step with a
heartbeat timeout, the heartbeat timer; a ``heartbeat`` moves the heartbeat timer
(``AttemptHeartbeatRecorded``, at most about two a heartbeat timeout: one within half
a timeout of the last recorded one changes nothing). The facts say which kind of
attempt they are about (``kind``).

Infrastructure losses (``AttemptLost``, ``RunState.infrastructure_losses``) are not
charged to a retry budget: an attempt no worker started before its schedule-to-start
timeout, a forward attempt whose heartbeats stopped, and (counted only, the attempt
goes on) a step started again by another worker (its work item was redelivered after
its worker was lost). Past ``Context.max_infrastructure_losses`` a loss is a failure
like any other. An attempt that may have had effects is never retried blindly: it
becomes Unknown; so does a started compensator whose heartbeats stopped, as one past
its compensation timeout does (it may have undone part of its step). Pure: no clock,
no I/O.
"""

from __future__ import annotations

from processor.facts import keys
from processor.facts.models import (
    AttemptHeartbeatRecorded,
    AttemptLost,
    AttemptProgress,
    AttemptStepStarted,
)
from processor.model import attempts, control
from processor.model.decision import Context, Decision, FactMaker
from processor.model.due import DueEntry
from processor.model.pipeline_spec import PipelineSpec
from processor.model.state import COMPENSATE, FORWARD, Attempt, AttemptKind, RunState
from processor.model.stop_notices import notify_lost
from processor.model.transitions import segment_failed

__all__ = [
    "LOSS_CAUSES",
    "attempt_steps",
    "decide_progress",
    "heartbeat_lost",
    "not_started",
    "record_start",
    "reported_attempt",
]

#: The timer kinds whose expiry is an infrastructure loss, by the cause they record.
LOSS_CAUSES = ("schedule_to_start_timeout", "heartbeat_timeout")
#: The kinds of attempt a report may name.
_KINDS: dict[str, AttemptKind] = {FORWARD: FORWARD, COMPENSATE: COMPENSATE}


def decide_progress(report: AttemptProgress, state: RunState | None, ctx: Context) -> Decision:
    """Record a start report or a heartbeat of the current attempt (forward or compensator).

    Refusals (``stale_attempt``, ``stale_progress``, ``step_not_started``,
    ``malformed_progress``, ``unknown_run``) are values, as for results; a
    duplicate start report or a heartbeat absorbed by the last recorded one is no
    refusal: it changes nothing. (A claim is ``claims.decide_claim``'s.)
    """
    found = reported_attempt(report, state)
    if isinstance(found, Decision):
        return found
    state, attempt = found
    spec = ctx.catalog.get(state.pipeline, state.pipeline_version)
    if spec is None:
        return Decision()  # its timeouts are unknown here: the report changes nothing
    first, last = attempt_steps(state, spec, attempt)
    if not first <= report.step <= last:
        detail = f"step {report.step} is outside the attempt's steps {first}..{last}"
        return Decision.refuse("malformed_progress", detail)
    if report.report == "started":
        return _started(report, state, spec, ctx, attempt)
    return _heartbeat(report, state, spec, ctx, attempt)


def reported_attempt(
    report: AttemptProgress, state: RunState | None
) -> tuple[RunState, Attempt] | Decision:
    """The run and the running attempt ``report`` names; else the refusal
    (``unknown_run``, ``malformed_progress``, ``stale_attempt``)."""
    if state is None:
        return Decision.refuse("unknown_run", f"no run {report.run_id}")
    kind = _KINDS.get(report.kind)
    if kind is None:
        return Decision.refuse("malformed_progress", f"unknown attempt kind {report.kind!r}")
    if kind == FORWARD:
        state = state.lane_view(report.segment)  # a graph run's step: its lane's attempt
    attempt = state.attempt_of(kind)
    named = (report.segment, report.attempt, report.generation)
    if state.terminal or not attempt.running or named != _identity(attempt):
        return Decision.refuse("stale_attempt", _stale_detail(report, state, attempt))
    return state, attempt


def _identity(attempt: Attempt) -> tuple[int, int, int]:
    return attempt.scope, attempt.number, attempt.generation


def attempt_steps(state: RunState, spec: PipelineSpec, attempt: Attempt) -> tuple[int, int]:
    """The steps the attempt runs: the rest of a forward segment, a compensator's own step."""
    if attempt.kind == COMPENSATE:
        return attempt.scope, attempt.scope
    first = state.attempt.next_step
    return first, spec.segment_end(first)


def _stale_detail(report: AttemptProgress, state: RunState, attempt: Attempt) -> str:
    what = "segment" if attempt.kind == FORWARD else "compensator of step"
    said = "claim" if report.claim else report.report
    return (
        f"{said} of {report.kind} {report.segment} attempt {report.attempt} "
        f"generation {report.generation}; run is {state.status}, phase {state.phase}, "
        f"{what} {attempt.scope} attempt {attempt.number} generation {attempt.generation}"
    )


def _started(
    report: AttemptProgress, state: RunState, spec: PipelineSpec, ctx: Context, attempt: Attempt
) -> Decision:
    started = attempt.started_step
    same_worker = attempt.worker_id == report.worker_id
    if started is not None and same_worker and report.step <= started:
        if report.step == started:
            return Decision()  # the same report again
        return Decision.refuse("stale_progress", f"step {report.step} after step {started}")
    redelivered = started is not None and not same_worker
    return record_start(report, state, spec, ctx, attempt, redelivered=redelivered)


def record_start(
    report: AttemptProgress,
    state: RunState,
    spec: PipelineSpec,
    ctx: Context,
    attempt: Attempt,
    *,
    redelivered: bool,
) -> Decision:
    """``AttemptStepStarted``: the reported step runs on the reporting worker, and the
    attempt's start-to-close (and heartbeat) timers run from now."""
    heartbeat = spec.steps[report.step].heartbeat_timeout_ms
    maker = FactMaker(state, state.run_id, ctx.now, _cause(report))
    key = keys.step_started(
        attempt.kind, attempt.scope, attempt.generation, report.step, state.version
    )
    maker.add(
        AttemptStepStarted(
            **maker.header(key),
            segment=attempt.scope,
            attempt=attempt.number,
            generation=attempt.generation,
            step=report.step,
            worker_id=report.worker_id,
            expires_ms=ctx.now + attempts.started_timeout_ms(spec, attempt.kind, report.step),
            heartbeat_due_ms=None if heartbeat is None else ctx.now + heartbeat,
            redelivered=redelivered,
            kind=attempt.kind,
        )
    )
    return maker.decision()


def _heartbeat(
    report: AttemptProgress, state: RunState, spec: PipelineSpec, ctx: Context, attempt: Attempt
) -> Decision:
    if attempt.started_step != report.step:
        detail = f"heartbeat of step {report.step}; started: {attempt.started_step}"
        return Decision.refuse("step_not_started", detail)
    if attempt.worker_id != report.worker_id:
        detail = f"heartbeat from {report.worker_id!r}; the step runs on {attempt.worker_id!r}"
        return Decision.refuse("stale_progress", detail)
    timeout = spec.steps[report.step].heartbeat_timeout_ms
    due = attempt.heartbeat_due_ms
    if timeout is None or due is None or 2 * (due - ctx.now) > timeout:
        return Decision()  # nothing to move, or within half a timeout of the last one
    maker = FactMaker(state, state.run_id, ctx.now, _cause(report))
    key = keys.heartbeat_recorded(
        attempt.kind, attempt.scope, attempt.generation, ctx.now + timeout
    )
    maker.add(
        AttemptHeartbeatRecorded(
            **maker.header(key),
            segment=attempt.scope,
            attempt=attempt.number,
            generation=attempt.generation,
            step=report.step,
            heartbeat_due_ms=ctx.now + timeout,
            kind=attempt.kind,
        )
    )
    return maker.decision()


def _cause(report: AttemptProgress) -> str:
    return (
        f"progress/{report.run_id}/{report.kind}/{report.segment}/{report.generation}/"
        f"{report.step}/{report.report}/{report.at_ms}"
    )


# --- lost attempts (timers) ---------------------------------------------------------------


def not_started(maker: FactMaker, spec: PipelineSpec, entry: DueEntry, limit: int) -> None:
    """The schedule-to-start timeout of an attempt no worker reported started."""
    attempt = _its(maker.current, entry)
    if attempt is None or attempt.started_step is not None:
        return
    if attempt.expires_ms is None or maker.now < attempt.expires_ms:
        return
    if attempt.kind == COMPENSATE:
        _compensator_lost(maker, spec, attempt, limit)
        return
    _lost(maker, spec, "schedule_to_start_timeout", maker.current.attempt.next_step, limit)


def heartbeat_lost(maker: FactMaker, spec: PipelineSpec, entry: DueEntry, limit: int) -> None:
    """The heartbeat timeout of a started step whose heartbeats stopped."""
    attempt = _its(maker.current, entry)
    if attempt is None or attempt.started_step is None:
        return
    if attempt.heartbeat_due_ms is None or maker.now < attempt.heartbeat_due_ms:
        return
    if attempt.kind == COMPENSATE:
        # As past its compensation timeout: it may have undone part of its step.
        attempts.mark_unknown(maker, attempt, step=attempt.scope)
        return
    _lost(maker, spec, "heartbeat_timeout", attempt.started_step, limit)


def _its(state: RunState, entry: DueEntry) -> Attempt | None:
    """The running attempt, if the timer ``entry`` is its."""
    attempt = state.running_attempt()
    if attempt is None or (entry.scope, entry.ordinal) != (attempt.scope, attempt.generation):
        return None
    return attempt


def _lost(maker: FactMaker, spec: PipelineSpec, cause: str, step: int, limit: int) -> None:
    """Unknown if the attempt may have had effects (a worker may have begun an effectful
    step without reporting it yet); else retried at once, not charged to the step's
    budget, while the run's infrastructure losses stay within ``limit``."""
    state = maker.current
    attempt = state.attempt_of(FORWARD)
    if spec.segment_effectful(state.attempt.next_step):
        attempts.mark_unknown(maker, attempt, step=step)
        return
    losses = state.infrastructure_losses + 1
    if losses > limit:
        error = f"attempt {attempt.number} lost ({cause}) after {limit} infrastructure losses"
        segment_failed(maker, spec, step=step, error=error, error_type=cause, retryable=True)
        return
    _record_loss(maker, attempt, cause, step, losses)
    if maker.current.stopping:
        control.settle_stop(maker, spec)
        return
    attempts.start_next(maker, spec, attempt)


def _compensator_lost(maker: FactMaker, spec: PipelineSpec, attempt: Attempt, limit: int) -> None:
    """A compensator no worker started in time: it undid nothing, so it is dispatched again
    at once, under the same attempt number (its retry budget is not charged), while the
    run's infrastructure losses stay within ``limit``; past it, a failure of the
    compensator, retried by its policy."""
    cause = "schedule_to_start_timeout"
    step = attempt.scope
    losses = maker.current.infrastructure_losses + 1
    if losses > limit:
        error = (
            f"compensator attempt {attempt.number} lost ({cause}) after {limit} "
            "infrastructure losses"
        )
        control.compensation_failed(
            maker, spec, step=step, error=error, error_type=cause, retryable=True
        )
        return
    _record_loss(maker, attempt, cause, step, losses)
    control.start_compensation(
        maker, spec, step=step, attempt=attempt.number, generation=attempt.generation + 1
    )


def _record_loss(maker: FactMaker, attempt: Attempt, cause: str, step: int, losses: int) -> None:
    """``AttemptLost``, and the stop notice to the lost attempt, which may still run."""
    maker.add(
        AttemptLost(
            **maker.header(keys.attempt_lost(attempt.kind, attempt.scope, attempt.generation)),
            segment=attempt.scope,
            attempt=attempt.number,
            generation=attempt.generation,
            step=step,
            cause=cause,
            losses=losses,
            kind=attempt.kind,
        )
    )
    notify_lost(maker, attempt)
