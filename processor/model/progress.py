"""Attempt progress: the timers that run from a worker's start, heartbeats, lost attempts.

A forward attempt is dispatched with no timer but its first step's schedule-to-start
timeout (time in the queue does not count). A worker's ``started`` report for the
current attempt records ``AttemptStepStarted`` and arms the start-to-close timer
(``PipelineSpec.started_timeout_ms``) and, for a step with a heartbeat timeout, the
heartbeat timer; a ``heartbeat`` moves the heartbeat timer (``AttemptHeartbeatRecorded``,
at most about two a heartbeat timeout: one within half a timeout of the last recorded
one changes nothing).

Infrastructure losses (``AttemptLost``, ``RunState.infrastructure_losses``) are not
charged to the step's retry budget: an attempt no worker started before its
schedule-to-start timeout, one whose heartbeats stopped, and (counted only, the
attempt goes on) a step started again by another worker (its work item was
redelivered after its worker was lost). Past ``Context.max_infrastructure_losses``
a loss is a failure like any other. An attempt that may have had effects is never
retried blindly: it becomes Unknown. Pure: no clock, no I/O.
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
from processor.model.state import FORWARD, RunState
from processor.model.stop_notices import notify_lost
from processor.model.transitions import segment_failed

__all__ = ["LOSS_CAUSES", "decide_progress", "heartbeat_lost", "not_started"]

#: The timer kinds whose expiry is an infrastructure loss, by the cause they record.
LOSS_CAUSES = ("schedule_to_start_timeout", "heartbeat_timeout")


def decide_progress(report: AttemptProgress, state: RunState | None, ctx: Context) -> Decision:
    """Record a start report or a heartbeat of the current forward attempt.

    Refusals (``stale_attempt``, ``stale_progress``, ``step_not_started``,
    ``malformed_progress``, ``unknown_run``) are values, as for results; a
    duplicate start report or a heartbeat absorbed by the last recorded one is no
    refusal: it changes nothing. A compensator's reports are ignored (its timer
    runs from dispatch).
    """
    if state is None:
        return Decision.refuse("unknown_run", f"no run {report.run_id}")
    if report.kind != FORWARD:
        return Decision()
    forward = state.attempt
    named = (report.segment, report.attempt, report.generation)
    if (
        state.terminal
        or state.phase != "dispatched"
        or named != (forward.segment, forward.number, forward.generation)
    ):
        return Decision.refuse("stale_attempt", _stale_detail(report, state))
    spec = ctx.catalog.get(state.pipeline, state.pipeline_version)
    if spec is None:
        return Decision()  # its timeouts are unknown here: the report changes nothing
    end = spec.segment_end(forward.next_step)
    if not forward.next_step <= report.step <= end:
        detail = f"step {report.step} is outside the attempt's steps {forward.next_step}..{end}"
        return Decision.refuse("malformed_progress", detail)
    if report.report == "started":
        return _started(report, state, spec, ctx)
    return _heartbeat(report, state, spec, ctx)


def _stale_detail(report: AttemptProgress, state: RunState) -> str:
    attempt = state.attempt
    return (
        f"{report.report} of segment {report.segment} attempt {report.attempt} generation "
        f"{report.generation}; run is {state.status}, phase {state.phase}, segment "
        f"{attempt.segment} attempt {attempt.number} generation {attempt.generation}"
    )


def _started(
    report: AttemptProgress, state: RunState, spec: PipelineSpec, ctx: Context
) -> Decision:
    forward = state.attempt
    started = forward.started_step
    same_worker = forward.worker_id == report.worker_id
    if started is not None and same_worker and report.step <= started:
        if report.step == started:
            return Decision()  # the same report again
        return Decision.refuse("stale_progress", f"step {report.step} after step {started}")
    heartbeat = spec.steps[report.step].heartbeat_timeout_ms
    maker = FactMaker(state, state.run_id, ctx.now, _cause(report))
    maker.add(
        AttemptStepStarted(
            **maker.header(
                keys.step_started(forward.segment, forward.generation, report.step, state.version)
            ),
            segment=forward.segment,
            attempt=forward.number,
            generation=forward.generation,
            step=report.step,
            worker_id=report.worker_id,
            expires_ms=ctx.now + spec.started_timeout_ms(report.step),
            heartbeat_due_ms=None if heartbeat is None else ctx.now + heartbeat,
            redelivered=started is not None and not same_worker,
        )
    )
    return maker.decision()


def _heartbeat(
    report: AttemptProgress, state: RunState, spec: PipelineSpec, ctx: Context
) -> Decision:
    forward = state.attempt
    if forward.started_step != report.step:
        detail = f"heartbeat of step {report.step}; started: {forward.started_step}"
        return Decision.refuse("step_not_started", detail)
    if forward.worker_id != report.worker_id:
        detail = f"heartbeat from {report.worker_id!r}; the step runs on {forward.worker_id!r}"
        return Decision.refuse("stale_progress", detail)
    timeout = spec.steps[report.step].heartbeat_timeout_ms
    due = forward.heartbeat_due_ms
    if timeout is None or due is None or 2 * (due - ctx.now) > timeout:
        return Decision()  # nothing to move, or within half a timeout of the last one
    maker = FactMaker(state, state.run_id, ctx.now, _cause(report))
    maker.add(
        AttemptHeartbeatRecorded(
            **maker.header(
                keys.heartbeat_recorded(forward.segment, forward.generation, ctx.now + timeout)
            ),
            segment=forward.segment,
            attempt=forward.number,
            generation=forward.generation,
            step=report.step,
            heartbeat_due_ms=ctx.now + timeout,
        )
    )
    return maker.decision()


def _cause(report: AttemptProgress) -> str:
    return (
        f"progress/{report.run_id}/{report.segment}/{report.generation}/{report.step}/"
        f"{report.report}/{report.at_ms}"
    )


# --- lost attempts (timers) ---------------------------------------------------------------


def not_started(maker: FactMaker, spec: PipelineSpec, entry: DueEntry, limit: int) -> None:
    """The schedule-to-start timeout of an attempt no worker reported started."""
    forward = maker.current.attempt
    if forward.started_step is not None or not _is_its(maker.current, entry):
        return
    if forward.expires_ms is None or maker.now < forward.expires_ms:
        return
    _lost(maker, spec, "schedule_to_start_timeout", forward.next_step, limit)


def heartbeat_lost(maker: FactMaker, spec: PipelineSpec, entry: DueEntry, limit: int) -> None:
    """The heartbeat timeout of a started step whose heartbeats stopped."""
    forward = maker.current.attempt
    if forward.started_step is None or not _is_its(maker.current, entry):
        return
    if forward.heartbeat_due_ms is None or maker.now < forward.heartbeat_due_ms:
        return
    _lost(maker, spec, "heartbeat_timeout", forward.started_step, limit)


def _is_its(state: RunState, entry: DueEntry) -> bool:
    forward = state.attempt
    return state.phase == "dispatched" and (entry.scope, entry.ordinal) == (
        forward.segment,
        forward.generation,
    )


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
    maker.add(
        AttemptLost(
            **maker.header(keys.attempt_lost(attempt.scope, attempt.generation)),
            segment=attempt.scope,
            attempt=attempt.number,
            generation=attempt.generation,
            step=step,
            cause=cause,
            losses=losses,
        )
    )
    notify_lost(maker, attempt)
    if maker.current.stopping:
        control.settle_stop(maker, spec)
        return
    attempts.start_next(maker, spec, attempt)
