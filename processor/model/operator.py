"""Operator commands on runs.commands: cancel a run, resolve an Unknown attempt."""

from __future__ import annotations

import hashlib
import json

from processor.facts import keys
from processor.facts.models import AttemptResolved, CancelRun, ResolveAttempt, SegmentCompleted
from processor.facts.payload import InvalidPayloadError, canonical_json
from processor.model import control, graph_run, waits
from processor.model.decision import Context, Decision, FactMaker, refuse, replier
from processor.model.pipeline_spec import PipelineSpec
from processor.model.state import RunState
from processor.model.transitions import (
    finish_success,
    segment_failed,
    start_attempt,
    step_completed,
)

__all__ = ["decide_cancel", "decide_resolve", "response"]


# --- cancel -------------------------------------------------------------------------------


def decide_cancel(command: CancelRun, state: RunState | None, ctx: Context) -> Decision:
    """Commit Cancelled stop intent once; a repeat, or a later stop reason, changes nothing."""
    reply = replier(command.command_id, command.run_id)
    if state is None:
        return refuse(reply, "unknown_run", f"no run {command.run_id}")
    if state.terminal or not waits.of(state).stoppable:
        return refuse(reply, "run_terminal", f"run {state.run_id} is already {state.status}")
    spec = ctx.catalog.get(state.pipeline, state.pipeline_version)
    if spec is None:
        return refuse(reply, "unknown_pipeline", f"pipeline {state.pipeline!r} is not loaded")
    maker = FactMaker(state, state.run_id, ctx.now, command.command_id, live=ctx.live_versions)
    control.deadline_first(maker, spec)
    current = maker.current
    if current.stop.reason is not None:
        control.settle_stop(maker, spec)
        detail = f"run is already stopping: {current.stop.reason}"
        maker.emits.append(reply(False, None, detail, response(state, stop=current.stop.reason)))
        return maker.decision()
    control.request_stop(maker, spec, "cancelled", command.reason or "cancelled by operator")
    maker.emits.append(reply(True, None, None, response(state, stop="cancelled")))
    return maker.decision()


def response(state: RunState, **fields: object) -> str:
    return json.dumps({"run_id": state.run_id, **fields}, sort_keys=True)


# --- operator resolution ------------------------------------------------------------------


def decide_resolve(command: ResolveAttempt, state: RunState | None, ctx: Context) -> Decision:
    """Settle an Unknown attempt: supplied success, declared failure or explicit retry.

    Refusals in a fixed order: the request itself, the recorded key, the exact
    attempt and generation, then the deadline policy.
    """
    reply = replier(command.command_id, command.run_id)
    problem, output = _request_problem(command)
    if problem:
        return refuse(reply, "invalid_request", problem)
    if state is None:
        return refuse(reply, "unknown_run", f"no run {command.run_id}")
    run = state
    lane = run.lane_of(command.segment) if command.kind == "forward" else None
    if lane is not None:
        state = run.lane_view(lane)  # a graph run's step: the Unknown attempt is its lane's
    fingerprint = _resolution_fingerprint(command, output)
    recorded = state.resolutions.get(command.idempotency_key)
    if recorded is not None:
        if recorded.fingerprint == fingerprint:
            return Decision(emits=(reply(False, None, "already applied", recorded.response),))
        detail = f"key {command.idempotency_key!r} was used for another command"
        return refuse(reply, "idempotency_conflict", detail)
    unknown = state.unknown
    named = (command.kind, command.segment, command.attempt, command.generation)
    if (
        unknown is None
        or state.terminal
        or (unknown.kind, unknown.segment, unknown.attempt, unknown.generation) != named
    ):
        return refuse(reply, "stale_attempt", "no unresolved attempt with that generation")
    spec = ctx.catalog.get(state.pipeline, state.pipeline_version)
    if spec is None:
        return refuse(reply, "unknown_pipeline", f"pipeline {state.pipeline!r} is not loaded")
    if command.action == "retry" and command.kind == "forward":
        if state.stop.reason == "cancelled":
            return refuse(reply, "retry_forbidden", "the run was cancelled")
        deadline_passed = state.deadline_ms is not None and ctx.now >= state.deadline_ms
        if state.stop.reason == "timed_out" or deadline_passed:
            return refuse(reply, "deadline_elapsed", "the run deadline has passed")
        if state.stop.reason is not None:
            return refuse(reply, "retry_forbidden", f"the run is stopping: {state.stop.reason}")
    maker = FactMaker(
        run, run.run_id, ctx.now, command.command_id, live=ctx.live_versions, lane=lane
    )
    if command.kind == "forward":
        control.deadline_first(maker, spec)
    answer = response(
        state,
        action=command.action,
        kind=command.kind,
        segment=command.segment,
        generation=command.generation,
    )
    maker.add(
        AttemptResolved(
            **maker.header(
                keys.attempt_resolved(command.kind, command.segment, command.generation)
            ),
            kind=command.kind,
            segment=command.segment,
            attempt=command.attempt,
            generation=command.generation,
            action=command.action,
            idempotency_key=command.idempotency_key,
            fingerprint=fingerprint,
            output=output,
            error=command.error,
            response=answer,
        )
    )
    if command.kind == "forward":
        _resolve_forward(maker, spec, command, output)
    else:
        _resolve_compensation(maker, spec, command)
    maker.emits.append(reply(True, None, None, answer))
    return maker.decision()


def _request_problem(command: ResolveAttempt) -> tuple[str, bytes | None]:
    if command.kind not in ("forward", "compensate"):
        return f"kind must be forward or compensate, got {command.kind!r}", None
    if command.action not in ("succeed", "fail", "retry"):
        return f"action must be succeed, fail or retry, got {command.action!r}", None
    if not command.idempotency_key:
        return "an idempotency key is required", None
    if (command.output is not None) != (command.action == "succeed"):
        return "exactly one command: succeed carries an output, fail an error, retry nothing", None
    if (command.error is not None) != (command.action == "fail"):
        return "exactly one command: succeed carries an output, fail an error, retry nothing", None
    if command.output is None:
        return "", None
    try:
        return "", canonical_json(command.output)
    except InvalidPayloadError as exc:
        return f"output: {exc}", None


def _resolution_fingerprint(command: ResolveAttempt, output: bytes | None) -> str:
    digest = hashlib.sha256()
    fields = (
        command.kind,
        str(command.segment),
        str(command.attempt),
        str(command.generation),
        command.action,
        (output or b"").decode(),
        command.error or "",
    )
    for part in fields:
        raw = part.encode()
        digest.update(len(raw).to_bytes(8, "big"))
        digest.update(raw)
    return "v1:" + digest.hexdigest()


def _resolve_forward(
    maker: FactMaker, spec: PipelineSpec, command: ResolveAttempt, output: bytes | None
) -> None:
    state = maker.current
    unknown_step = state.attempt.next_step
    if command.action == "succeed":
        assert output is not None
        step_completed(maker, state, unknown_step, output)
        if spec.graph is not None:  # the graph step's lane closes; the graph goes on
            if maker.current.stopping:
                graph_run.settle_under_stop(maker, spec, unknown_step, "succeeded")
            else:
                graph_run.succeeded(maker, spec, unknown_step, ())
        elif maker.current.stopping:
            control.settle_stop(maker, spec)
        else:
            _continue_after(maker, spec, unknown_step, output)
    elif command.action == "fail":
        segment_failed(
            maker,
            spec,
            step=unknown_step,
            error=command.error or "declared failure",
            error_type="DeclaredFailure",
            retryable=False,
            reason="operator_failed",
        )
    else:  # explicit retry: generation G+1; G can never commit again
        start_attempt(
            maker,
            spec,
            segment=state.attempt.segment,
            attempt=state.attempt.number,
            generation=state.attempt.generation + 1,
            first_step=unknown_step,
            input=state.last_output,
        )


def _continue_after(maker: FactMaker, spec: PipelineSpec, step: int, output: bytes) -> None:
    state = maker.current
    if step == spec.last_step:
        maker.add(
            SegmentCompleted(
                **maker.header(keys.segment_completed(state.attempt.segment)),
                segment=state.attempt.segment,
                attempt=state.attempt.number,
                generation=state.attempt.generation,
                last_step=step,
            )
        )
        finish_success(maker, spec)
        return
    start_attempt(
        maker,
        spec,
        segment=state.attempt.segment,
        attempt=state.attempt.number + 1,
        generation=state.attempt.generation + 1,
        first_step=step + 1,
        input=output,
    )


def _resolve_compensation(maker: FactMaker, spec: PipelineSpec, command: ResolveAttempt) -> None:
    step = command.segment
    if command.action == "succeed":
        control.compensation_succeeded(maker, spec, step)
    elif command.action == "fail":
        error = command.error or "declared failure"
        control.compensation_failed(
            maker, spec, step=step, error=error, error_type="DeclaredFailure", retryable=False
        )
    else:  # recovery has its own attempts; the forward deadline does not apply
        state = maker.current
        control.start_compensation(
            maker,
            spec,
            step=step,
            attempt=state.compensation.attempt,
            generation=command.generation + 1,
        )
