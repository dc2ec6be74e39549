"""Decide: from the run projection, one input and the time, to facts and messages.

Pure: no I/O, no clock reads. Refusals are values (``Decision.refusal``), never
exceptions, and a refused input changes nothing (except where a deadline that
already passed commits its consequence in the same decision).

Entry points, one per kind of input: ``decide_submit`` (runs.commands; operator
commands are in ``operator``), ``decide_result`` (segments.results),
``decide_timer`` (the due-work index). Admission of boundary completions is in
``processor.admission.admit``.
"""

from __future__ import annotations

from processor.facts import keys, payload
from processor.facts.models import (
    AttemptResolved,
    SegmentCompleted,
    SegmentFailed,
    SegmentResult,
    SubmitRun,
)
from processor.facts.payload import InvalidPayloadError, canonical_json, derive_run_id
from processor.model import control
from processor.model.boundaries import apply_plan, suspend, timeout_interaction
from processor.model.decision import (
    Context,
    Decision,
    Emit,
    FactMaker,
    PipelineCatalog,
    Publish,
    Reply,
    TimerFired,
    refuse,
    replier,
)
from processor.model.due import DueEntry
from processor.model.operator import decide_cancel, decide_resolve, response
from processor.model.pipeline_spec import PipelineSpec
from processor.model.state import RunState
from processor.model.transitions import (
    finish_success,
    publish,
    segment_failed,
    start_attempt,
    start_run,
    step_completed,
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
    "decide_cancel",
    "decide_resolve",
    "decide_result",
    "decide_submit",
    "decide_timer",
    "start_attempt",
    "start_run",
    "timeout_interaction",
]

ATTEMPT_TIMEOUT = "attempt_timeout"


# --- submit -------------------------------------------------------------------------------


def decide_submit(command: SubmitRun, existing: RunState | None, ctx: Context) -> Decision:
    """Accept a new run, return the original one for an identical keyed retry, or refuse."""
    reply = replier(command.command_id, command.run_id)
    spec = ctx.catalog.latest(command.pipeline)
    if spec is None:
        return refuse(reply, "unknown_pipeline", f"no pipeline named {command.pipeline!r}")
    try:
        canonical_input = canonical_json(command.input)
    except InvalidPayloadError as exc:
        return refuse(reply, "invalid_input", str(exc))
    fingerprint = None
    if command.idempotency_key is not None:
        if command.run_id != derive_run_id(command.idempotency_key):
            detail = "run_id must be derived from the idempotency key (processor.facts.payload)"
            return refuse(reply, "invalid_command", detail)
        fingerprint = _submit_fingerprint(command, canonical_input)
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
        deadline_ms=_run_deadline(command),
    )
    start_attempt(
        maker, spec, segment=1, attempt=1, generation=1, first_step=0, input=canonical_input
    )
    maker.emits.append(reply(True))
    return maker.decision()


def _run_deadline(command: SubmitRun) -> int | None:
    """The absolute deadline: as given, or relative to the submit that created the run."""
    if command.deadline_ms is not None or command.deadline_after_ms is None:
        return command.deadline_ms
    return command.submitted_ms + command.deadline_after_ms


def _submit_fingerprint(command: SubmitRun, canonical_input: bytes) -> str:
    """The caller's fields: a relative deadline as given, so that a retry made later
    with the same ``deadline_after_ms`` is the same submit (the first one fixed the time)."""
    fields = canonical_input
    if command.deadline_ms is not None:
        fields += b"\x00deadline_ms=" + str(command.deadline_ms).encode()
    if command.deadline_after_ms is not None:
        fields += b"\x00deadline_after_ms=" + str(command.deadline_after_ms).encode()
    return payload.submit_fingerprint(command.pipeline, fields)


def _resubmitted(
    command: SubmitRun, existing: RunState, fingerprint: str | None, reply: Reply
) -> Decision:
    if command.idempotency_key is not None and existing.fingerprint == fingerprint:
        return Decision(emits=(reply(False),))
    if command.idempotency_key is None and existing.submit_command_id == command.command_id:
        return Decision(emits=(reply(False),))  # the same command delivered again
    if command.idempotency_key is not None:
        detail = f"idempotency key {command.idempotency_key!r} was used with different fields"
        return refuse(reply, "idempotency_conflict", detail)
    return refuse(reply, "run_exists", f"run {command.run_id} already exists")


# --- worker results -----------------------------------------------------------------------


def decide_result(result: SegmentResult, state: RunState | None, ctx: Context) -> Decision:
    """Accept the current attempt's result; refuse stale or malformed ones untouched."""
    if state is None:
        return Decision.refuse("unknown_run", f"no run {result.run_id}")
    if result.kind == "compensate":
        return _compensation_result(result, state, ctx)
    if state.terminal or not _is_current(result, state):
        return Decision.refuse("stale_attempt", _stale_detail(result, state))
    spec = ctx.catalog.get(state.pipeline, state.pipeline_version)
    if spec is None:
        detail = f"pipeline {state.pipeline!r} version {state.pipeline_version} is not loaded"
        return Decision.refuse("unknown_pipeline", detail)
    problem = _result_problem(result, state, spec)
    if problem:
        return Decision.refuse("malformed_result", problem)
    maker = FactMaker(state, state.run_id, ctx.now, result.result_id)
    control.deadline_first(maker)
    for done in result.steps:
        step_completed(maker, state, done.step, done.output)
    if maker.current.stopping:
        _settle_under_stop(maker, spec, result)
    elif result.outcome == "completed":
        _segment_completed(maker, spec)
        finish_success(maker, spec)
    elif result.outcome == "suspended":
        suspend(maker, spec, result, ctx)
    else:
        step = result.failed_step if result.failed_step is not None else maker.current.next_step
        segment_failed(
            maker,
            spec,
            step=step,
            error=result.error or "",
            error_type=result.error_type or "Error",
            retryable=result.retryable,
        )
    return maker.decision()


def _is_current(result: SegmentResult, state: RunState) -> bool:
    named = (result.segment, result.attempt, result.generation)
    if state.phase == "dispatched":
        return named == (state.segment, state.attempt, state.generation)
    unknown = state.unknown
    if state.phase == "unknown" and unknown is not None and unknown.kind == "forward":
        return named == (unknown.segment, unknown.attempt, unknown.generation)  # a late result
    return False


def _stale_detail(result: SegmentResult, state: RunState) -> str:
    return (
        f"result for segment {result.segment} attempt {result.attempt} generation "
        f"{result.generation}; run is {state.status}, phase {state.phase}, segment "
        f"{state.segment} attempt {state.attempt} generation {state.generation}"
    )


def _segment_completed(maker: FactMaker, spec: PipelineSpec, last_step: int | None = None) -> None:
    state = maker.current
    maker.add(
        SegmentCompleted,
        keys.segment_completed(state.segment),
        segment=state.segment,
        attempt=state.attempt,
        generation=state.generation,
        last_step=spec.last_step if last_step is None else last_step,
    )


def _settle_under_stop(maker: FactMaker, spec: PipelineSpec, result: SegmentResult) -> None:
    """The running attempt settles: its completed steps count, nothing new starts."""
    state = maker.current
    if result.outcome == "failed":
        step = result.failed_step if result.failed_step is not None else state.next_step
        maker.add(
            SegmentFailed,
            keys.attempt_failed(state.segment, state.generation),
            segment=state.segment,
            attempt=state.attempt,
            generation=state.generation,
            step=step,
            error=result.error or "",
            error_type=result.error_type or "Error",
            retryable=False,
        )
    else:  # the attempt settled after its last completed step (-1: none at all)
        last = result.steps[-1].step if result.steps else state.next_step - 1
        _segment_completed(maker, spec, last_step=last)
    control.settle_stop(maker, spec)


def _compensation_result(result: SegmentResult, state: RunState, ctx: Context) -> Decision:
    unknown = state.unknown
    named = (result.segment, result.attempt, result.generation)
    running = state.phase == "compensating" and named == (
        state.compensating_step,
        state.compensation_attempt,
        state.compensation_generation,
    )
    late = (
        state.phase == "unknown"
        and unknown is not None
        and unknown.kind == "compensate"
        and named == (unknown.segment, unknown.attempt, unknown.generation)
    )
    if state.terminal or not (running or late):
        return Decision.refuse("stale_attempt", _stale_detail(result, state))
    spec = ctx.catalog.get(state.pipeline, state.pipeline_version)
    if spec is None:
        return Decision.refuse("unknown_pipeline", f"pipeline {state.pipeline!r} is not loaded")
    maker = FactMaker(state, state.run_id, ctx.now, result.result_id)
    if late:  # the compensator's own result settles its Unknown attempt
        maker.add(
            AttemptResolved,
            keys.attempt_resolved("compensate", result.segment, result.generation),
            kind="compensate",
            segment=result.segment,
            attempt=result.attempt,
            generation=result.generation,
            action="worker_result",
            idempotency_key=f"worker/{result.result_id}",
            fingerprint="worker",
            response=response(state, action="worker_result"),
        )
    if result.outcome == "completed":
        control.compensation_succeeded(maker, spec, result.segment)
    else:
        control.compensation_failed(
            maker,
            spec,
            step=result.segment,
            error=result.error or "",
            error_type=result.error_type or "Error",
            retryable=result.retryable,
        )
    return maker.decision()


def _result_problem(result: SegmentResult, state: RunState, spec: PipelineSpec) -> str:
    expected = list(range(state.next_step, state.next_step + len(result.steps)))
    if [s.step for s in result.steps] != expected:
        return f"steps {[s.step for s in result.steps]} do not continue from step {state.next_step}"
    for step in result.steps:
        try:
            canonical_json(step.output)
        except InvalidPayloadError as exc:
            return f"step {step.step} output: {exc}"
    for index, request in enumerate(result.requests):
        try:
            if request:
                canonical_json(request)
        except InvalidPayloadError as exc:
            return f"request {index}: {exc}"
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
    if entry.kind == "publication":
        if state.phase == "publishing":
            publish(maker, spec, ctx.resume_keys)
        return maker.decision()
    control.deadline_first(maker)
    if entry.kind == "attempt_timeout":
        _attempt_timed_out(maker, spec, entry)
    elif entry.kind == "compensation_timeout":
        _compensation_timed_out(maker, entry)
    elif entry.kind == "compensation_retry":
        _compensation_retry_due(maker, spec, entry)
    elif not maker.current.stopping:
        if entry.kind == "retry":
            _retry_due(maker, spec, entry)
        elif entry.kind == "interaction_timeout":
            _interaction_due(maker, spec, keys.interaction_id(entry.scope, entry.ordinal))
    control.settle_stop(maker, spec)
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
    if spec.segment_effectful(state.next_step):
        control.mark_unknown(
            maker,
            kind="forward",
            segment=state.segment,
            attempt=state.attempt,
            generation=state.generation,
            step=state.next_step,
        )
        return
    error = f"attempt {state.attempt} produced no result before its deadline (worker lost?)"
    segment_failed(
        maker,
        spec,
        step=state.next_step,
        error=error,
        error_type=ATTEMPT_TIMEOUT,
        retryable=True,
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


def _compensation_timed_out(maker: FactMaker, entry: DueEntry) -> None:
    """A lost compensator attempt becomes Unknown and stops the unwind for an operator."""
    state = maker.current
    if state.phase != "compensating" or state.compensation_generation != entry.ordinal:
        return
    if state.compensation_expires_ms is None or maker.now < state.compensation_expires_ms:
        return
    step = state.compensating_step
    assert step is not None
    control.mark_unknown(
        maker,
        kind="compensate",
        segment=step,
        attempt=state.compensation_attempt,
        generation=state.compensation_generation,
        step=step,
    )


def _compensation_retry_due(maker: FactMaker, spec: PipelineSpec, entry: DueEntry) -> None:
    state = maker.current
    if state.phase != "compensation_retry_wait" or state.compensation_generation != entry.ordinal:
        return
    if state.compensation_retry_due_ms is None or maker.now < state.compensation_retry_due_ms:
        return
    step = state.compensating_step
    assert step is not None
    control.start_compensation(
        maker,
        spec,
        step=step,
        attempt=state.compensation_attempt + 1,
        generation=state.compensation_generation + 1,
    )
