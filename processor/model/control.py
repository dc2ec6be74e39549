"""Run control: stop intent, the run deadline, the unwind (compensation), terminal records.

Semantics (seed 002): the first committed stop reason decides; stop intent fences
queued forward work and open interactions; an attempt already running settles
first; then completed steps are compensated one at a time in reverse completion
order (each compensator an attempt with the forward timing rules: ``progress``), and
the terminal record keeps two outcomes, execution and recovery.
"""

from __future__ import annotations

from processor.facts import keys
from processor.facts.models import (
    CompensationAttemptFailed,
    CompensationStarted,
    CompensationStepCompleted,
    CompensationStepSkipped,
    DeadLetter,
    RunFailed,
    RunStopped,
    RunStopRequested,
)
from processor.facts.topics import TopicName
from processor.model import attempts, graph_nodes, waits
from processor.model.decision import FactMaker
from processor.model.pipeline_spec import PipelineSpec
from processor.model.state import COMPENSATE, RunState
from processor.model.stop_notices import notify_stop

__all__ = [
    "EXECUTION_OF_STOP",
    "compensation_failed",
    "compensation_succeeded",
    "deadline_first",
    "fail_execution",
    "request_stop",
    "settle_stop",
    "start_compensation",
]

EXECUTION_OF_STOP = {"cancelled": "Cancelled", "timed_out": "TimedOut", "failed": "Failed"}


def deadline_first(maker: FactMaker, spec: PipelineSpec) -> None:
    """At or after the run deadline, commit TimedOut stop intent before anything else.

    The deadline is authoritative over dispatch order: whatever input is being
    processed (result, completion, timer, operator command) is then handled under
    stopping semantics in the same commit.
    """
    state = maker.current
    if state.deadline_ms is None or state.stop.reason is not None or state.terminal:
        return
    if not waits.of(state).stoppable or maker.now < state.deadline_ms:
        return  # e.g. a publishing run: it already completed its execution
    detail = f"run deadline {state.deadline_ms} passed (now {maker.now})"
    _stop_requested(maker, spec, "timed_out", detail)


def request_stop(maker: FactMaker, spec: PipelineSpec, reason: str, detail: str) -> None:
    _stop_requested(maker, spec, reason, detail)
    settle_stop(maker, spec)


def _stop_requested(maker: FactMaker, spec: PipelineSpec, reason: str, detail: str) -> None:
    """Stop intent, and the notices that carry it to the running attempt and to the
    outside systems of open interactions (``stop_notices``)."""
    before = maker.run
    maker.add(RunStopRequested(**maker.header(keys.STOP), reason=reason, detail=detail))
    notify_stop(maker, before, spec, reason)


def settle_stop(maker: FactMaker, spec: PipelineSpec) -> None:
    """Once nothing runs any more, snapshot the unwind (or terminalize an empty one)."""
    state = maker.run
    if not state.stopping or state.compensation.started:
        return
    if waits.holds_stop(state):
        return  # the running attempts settle first (or an operator resolves them)
    if spec.graph is not None and graph_nodes.run_finally(maker, spec):
        return  # a graph's finally steps run before the unwind
    _begin_unwind(maker, spec)


def fail_execution(maker: FactMaker, spec: PipelineSpec, *, error: str) -> None:
    """The run failed: unwind its completed steps if the pipeline compensates, then RunFailed."""
    state = maker.current
    if state.stopping:
        settle_stop(maker, spec)
        return
    if spec.compensates and state.completed_steps:
        _stop_requested(maker, spec, "failed", error)
        _begin_unwind(maker, spec)
        return
    _terminate(maker, "NotRequired")


# --- the unwind -----------------------------------------------------------------------------


def _begin_unwind(maker: FactMaker, spec: PipelineSpec) -> None:
    state = maker.current
    steps = tuple(reversed(state.completed_steps))
    if not spec.compensates or not steps:
        _terminate(maker, "NotRequired")  # nothing to undo: an empty unwind
        return
    maker.add(CompensationStarted(**maker.header(keys.COMPENSATION), steps=steps))
    _advance_unwind(maker, spec)


def _advance_unwind(maker: FactMaker, spec: PipelineSpec) -> None:
    """Skip steps without a compensator; dispatch the next one; terminalize at the end."""
    while True:
        state = maker.current
        if state.compensation.failed:
            _terminate(maker, "CompensationFailed")
            return
        if not state.compensation.unwind:
            _terminate(maker, _recovery(state))
            return
        step = state.compensation.unwind[0]
        if spec.steps[step].compensation is None:
            maker.add(
                CompensationStepSkipped(
                    **maker.header(keys.compensation_done(step)), step=step, reason="no_compensator"
                )
            )
            continue
        start_compensation(maker, spec, step=step, attempt=1, generation=1)
        return


def start_compensation(
    maker: FactMaker, spec: PipelineSpec, *, step: int, attempt: int, generation: int
) -> None:
    """A compensator attempt for ``step``, on its output (``attempts.start``), timed as a
    forward attempt is: its compensation timeout runs from a worker's start report
    (``progress``)."""
    attempts.start(
        maker,
        spec,
        COMPENSATE,
        scope=step,
        number=attempt,
        generation=generation,
        first_step=step,
        input=maker.current.step_outputs.get(step, b"null"),
    )


def compensation_succeeded(maker: FactMaker, spec: PipelineSpec, step: int) -> None:
    state = maker.current
    maker.add(
        CompensationStepCompleted(
            **maker.header(keys.compensation_done(step)),
            step=step,
            attempt=state.compensation.attempt,
            generation=state.compensation.generation,
        )
    )
    _advance_unwind(maker, spec)


def compensation_failed(
    maker: FactMaker, spec: PipelineSpec, *, step: int, error: str, error_type: str, retryable: bool
) -> None:
    """Retry the compensator by its own policy, or stop the unwind as CompensationFailed."""
    state = maker.current
    compensation = spec.steps[step].compensation
    assert compensation is not None
    attempt = state.compensation.attempt
    decision = attempts.retry_decision(compensation.retry, attempt, retryable, maker.now)
    due = decision.due_ms
    maker.add(
        CompensationAttemptFailed(
            **maker.header(keys.compensation_failed(step, state.compensation.generation)),
            step=step,
            attempt=attempt,
            generation=state.compensation.generation,
            error=error,
            error_type=error_type,
            retry_due_ms=due,
            reason=decision.reason,
        )
    )
    if due is None:
        _advance_unwind(maker, spec)


def _recovery(state: RunState) -> str:
    if state.compensation.failed:
        return "CompensationFailed"
    if state.compensation.skipped:
        return "PartiallyCompensated"
    if state.compensation.compensated:
        return "Compensated"
    return "NotRequired"


def _terminate(maker: FactMaker, recovery: str) -> None:
    """The terminal record: RunStopped for a cancel or timeout, RunFailed (and DLQ) otherwise."""
    state = maker.current
    reason = state.stop.reason or "failed"
    execution = EXECUTION_OF_STOP[reason]
    if reason == "failed":
        _run_failed(maker, state, recovery)
        return
    maker.add(
        RunStopped(
            **maker.header(keys.TERMINAL),
            execution=execution,
            recovery=recovery,
            detail=state.stop.detail or "",
        )
    )
    maker.emit_outcome(
        "cancelled" if reason == "cancelled" else "timed_out", error=state.stop.detail
    )


def _run_failed(maker: FactMaker, state: RunState, recovery: str) -> None:
    step = state.failed_step if state.failed_step is not None else state.attempt.next_step
    error = state.error or state.stop.detail or "failed"
    error_type = state.error_type or "Error"
    attempts = state.attempt.step_attempts
    maker.add(
        RunFailed(
            **maker.header(keys.TERMINAL),
            error=error,
            error_type=error_type,
            step=step,
            attempts=attempts,
            recovery=recovery,
            reason=state.attempt.retry_reason,
        )
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
    maker.emit_outcome("failed", error=error)
