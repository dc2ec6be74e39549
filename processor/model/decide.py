"""Decide: from the run projection, one input and the time, to facts and messages.

Pure: no I/O, no clock reads. Refusals are values (``Decision.refusal``), never
exceptions, and a refused input changes nothing (except where a deadline that
already passed commits its consequence in the same decision).

Entry points, one per kind of input: ``decide_submit`` (runs.commands; operator
commands are in ``operator``), ``decide_result`` (segments.results),
``decide_timer`` (the due-work index); ``decide_redrive`` (a failed run again) is in
``redrive``. Admission of boundary completions is in
``processor.admission.admit``.
"""

from __future__ import annotations

from collections.abc import Callable

from processor.facts import keys, payload
from processor.facts.models import (
    AttemptResolved,
    SegmentCompleted,
    SegmentFailed,
    SegmentResult,
    SubmitRun,
)
from processor.facts.payload import InvalidPayloadError, canonical_json, derive_run_id
from processor.facts.traceparent import is_traceparent
from processor.model import (
    attempts,
    children,
    control,
    emission,
    event_waits,
    graph_run,
    progress,
    schedules,
    sleeps,
    waits,
)
from processor.model.boundaries import apply_plan, continue_boundary, suspend, timeout_interaction
from processor.model.claims import decide_claim
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
from processor.model.lanes import item_of
from processor.model.operator import decide_cancel, decide_resolve, response
from processor.model.pipeline_spec import PipelineSpec
from processor.model.progress import decide_progress
from processor.model.redrive import decide_redrive
from processor.model.state import COMPENSATE, FORWARD, AttemptKind, RunState
from processor.model.timers import ATTEMPT_TIMERS, DueEntry, TimerKind
from processor.model.transitions import (
    STOP_REASONS,
    finish_success,
    publish,
    segment_failed,
    start_attempt,
    start_run,
    step_completed,
)

__all__ = [
    "TIMER_DECISIONS",
    "Context",
    "Decision",
    "Emit",
    "FactMaker",
    "PipelineCatalog",
    "Publish",
    "TimerDecision",
    "TimerFired",
    "apply_plan",
    "continue_boundary",
    "decide_cancel",
    "decide_claim",
    "decide_progress",
    "decide_redrive",
    "decide_resolve",
    "decide_result",
    "decide_submit",
    "decide_timer",
    "decide_unblock",
    "start_attempt",
    "start_run",
    "timeout_interaction",
]

ATTEMPT_TIMEOUT = "attempt_timeout"
#: The error type of a worker's answer to a work item whose pipeline version it has not
#: loaded (``worker/executor.py``): the run waits for another worker, uncharged.
UNKNOWN_PIPELINE = "UnknownPipeline"
#: The latest time a timer can hold: a fact carries it as an Avro long, the due index
#: keys it on 8 unsigned bytes (before 0 and past this, a deadline is refused).
_LATEST_MS = 2**63 - 1


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
    too_large = payload.oversize(canonical_input, ctx.max_payload_bytes, "run input")
    if too_large is not None:
        return refuse(reply, "payload_too_large", too_large)
    if refused := children.submit_refusal(command) or schedules.submit_refusal(command):
        return refuse(reply, *refused)
    deadline_ms = _run_deadline(command)
    if deadline_ms is not None and not 0 <= deadline_ms <= _LATEST_MS:
        detail = f"the run deadline {deadline_ms} is not a time in epoch milliseconds"
        return refuse(reply, "invalid_command", detail)
    fingerprint = None
    if command.idempotency_key is not None:
        if command.run_id != derive_run_id(command.idempotency_key):
            detail = "run_id must be derived from the idempotency key (processor.facts.payload)"
            return refuse(reply, "invalid_command", detail)
        fingerprint = _submit_fingerprint(command, canonical_input)
    if existing is not None:
        return _resubmitted(command, existing, fingerprint, reply)
    maker = FactMaker(None, command.run_id, ctx.now, command.command_id, live=ctx.live_versions)
    start_run(
        maker,
        spec,
        canonical_input=canonical_input,
        idempotency_key=command.idempotency_key,
        fingerprint=fingerprint,
        submitted_ms=command.submitted_ms,
        deadline_ms=deadline_ms,
        traceparent=_trace_context(command.traceparent),
    )
    children.link(maker, command)
    schedules.link(maker, command)
    if spec.graph is not None:
        graph_run.advance(maker, spec)  # its first steps, each in a lane of its own
    else:
        start_attempt(
            maker, spec, segment=1, attempt=1, generation=1, first_step=0, input=canonical_input
        )
    maker.emits.append(reply(True))
    return maker.decision()


def _trace_context(traceparent: str | None) -> str | None:
    """The submit's traceparent if it is a valid one: as W3C Trace Context asks of a
    receiver, a malformed one is ignored (the run starts without a trace, not refused)."""
    return traceparent if traceparent is not None and is_traceparent(traceparent) else None


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
    # a forward result about a live lane of a graph run is that lane's
    run, lane = state, None if result.kind == "compensate" else state.lane_of(result.segment)
    state = state if lane is None else state.lane_view(lane)  # a graph step's: its lane's
    if state.terminal or not _is_current(result, state):
        return Decision.refuse("stale_attempt", _stale_detail(result, state))
    if result.kind == "compensate":
        return _compensation_result(result, state, ctx)
    spec = ctx.catalog.get(state.pipeline, state.pipeline_version)
    if spec is None:
        detail = f"pipeline {state.pipeline!r} version {state.pipeline_version} is not loaded"
        return Decision.refuse("unknown_pipeline", detail)
    problem = _result_problem(result, state, spec)
    if problem:
        return Decision.refuse("malformed_result", problem)
    routes: tuple[str, ...] = ()
    if spec.graph is not None:
        routes, result = _switch_choice(spec, result)
    result = emission.checked(spec, state, result, ctx.emit_topics)
    maker = FactMaker(run, run.run_id, ctx.now, result.result_id, live=ctx.live_versions, lane=lane)
    control.deadline_first(maker, spec)
    emission.record(maker, spec, state, result)
    item = None if lane is None else item_of(lane)
    if item is not None and result.outcome == "completed":  # a fan-out item's output
        step = graph_run.step_of(result.segment)
        graph_run.item_succeeded(maker, spec, step, item, result.steps[-1].output)
        return maker.decision()
    for done in result.steps:
        step_completed(maker, state, done.step, done.output)
    if result.outcome == "skipped":  # a graph step's predicate was false
        graph_run.predicate_false(maker, spec, graph_run.step_of(result.segment))
    elif maker.current.stopping:
        _settle_under_stop(maker, spec, result)
    elif spec.graph is not None and result.outcome == "completed":
        step = graph_run.step_of(result.segment)
        _segment_completed(maker, spec, last_step=step)
        graph_run.succeeded(maker, spec, step, routes)
    elif _lacks_version(result):
        _worker_lacks_version(maker, result)
    elif result.outcome == "completed":
        _segment_completed(maker, spec)
        finish_success(maker, spec)
    elif result.outcome == "suspended" and spec.steps[maker.current.attempt.next_step].sleeps:
        sleeps.start_sleep(maker, spec, result)
    elif result.outcome == "suspended":
        suspend(maker, spec, result, ctx)
    else:
        step = (
            result.failed_step
            if result.failed_step is not None
            else maker.current.attempt.next_step
        )
        segment_failed(
            maker,
            spec,
            step=step,
            error=result.error or "",
            error_type=result.error_type or "Error",
            retryable=result.retryable,
        )
    return maker.decision()


def _switch_choice(
    spec: PipelineSpec, result: SegmentResult
) -> tuple[tuple[str, ...], SegmentResult]:
    """A switch's chosen routes; a choice of no declared route fails the switch (not
    retried: its function chose wrongly, and would again)."""
    if result.outcome != "completed" or not result.steps:
        return (), result
    last = result.steps[-1]
    routes, problem = graph_run.route_problem(spec, last.step, last.output)
    if not problem:
        return routes, result
    failed = result.model_copy(
        update={
            "outcome": "failed",
            "steps": result.steps[:-1],
            "failed_step": last.step,
            "error": problem,
            "error_type": graph_run.INVALID_ROUTE,
            "retryable": False,
        }
    )
    return (), failed


def _lacks_version(result: SegmentResult) -> bool:
    return result.outcome == "failed" and result.error_type == UNKNOWN_PIPELINE and not result.steps


def _worker_lacks_version(maker: FactMaker, result: SegmentResult) -> None:
    """The worker owning the run's work partition has not loaded its version: the attempt
    never ran, so it is not charged; the run waits, blocked, and is dispatched again
    (the same attempt number, the next generation) when the fleet of workers changes."""
    attempt = maker.current.attempt
    attempts.block(
        maker,
        segment=attempt.segment,
        number=attempt.number,
        generation=attempt.generation + 1,
        first_step=attempt.next_step,
        step_attempts=max(0, attempt.step_attempts - 1),
        reason="worker_lacks_version",
        detail=result.error or "",
        worker_id=result.worker_id,
    )


def _is_current(result: SegmentResult, state: RunState) -> bool:
    kind = COMPENSATE if result.kind == "compensate" else FORWARD
    return attempts.is_current(state, kind, result.segment, result.attempt, result.generation)


def _stale_detail(result: SegmentResult, state: RunState) -> str:
    attempt = state.attempt
    return (
        f"result for segment {result.segment} attempt {result.attempt} generation "
        f"{result.generation}; run is {state.status}, phase {state.phase}, segment "
        f"{attempt.segment} attempt {attempt.number} generation {attempt.generation}"
    )


def _segment_completed(maker: FactMaker, spec: PipelineSpec, last_step: int | None = None) -> None:
    state = maker.current
    maker.add(
        SegmentCompleted(
            **maker.header(keys.segment_completed(state.attempt.segment)),
            segment=state.attempt.segment,
            attempt=state.attempt.number,
            generation=state.attempt.generation,
            last_step=spec.last_step if last_step is None else last_step,
        )
    )


def _settle_under_stop(maker: FactMaker, spec: PipelineSpec, result: SegmentResult) -> None:
    """The running attempt settles: its completed steps count, nothing new starts."""
    state = maker.current
    if result.outcome == "failed":
        step = result.failed_step if result.failed_step is not None else state.attempt.next_step
        maker.add(
            SegmentFailed(
                **maker.header(
                    keys.attempt_failed(state.attempt.segment, state.attempt.generation)
                ),
                segment=state.attempt.segment,
                attempt=state.attempt.number,
                generation=state.attempt.generation,
                step=step,
                error=result.error or "",
                error_type=result.error_type or "Error",
                retryable=False,
                reason=STOP_REASONS.get(state.stop.reason or "", "stopping"),
            )
        )
    else:  # the attempt settled after its last completed step (-1: none at all)
        last = result.steps[-1].step if result.steps else state.attempt.next_step - 1
        _segment_completed(maker, spec, last_step=last)
    if spec.graph is not None:  # the step's lane closes
        status = "succeeded" if result.outcome == "completed" else "failed"
        graph_run.settle_under_stop(maker, spec, graph_run.step_of(result.segment), status)
        return
    control.settle_stop(maker, spec)


def _compensation_result(result: SegmentResult, state: RunState, ctx: Context) -> Decision:
    spec = ctx.catalog.get(state.pipeline, state.pipeline_version)
    if spec is None:
        return Decision.refuse("unknown_pipeline", f"pipeline {state.pipeline!r} is not loaded")
    maker = FactMaker(state, state.run_id, ctx.now, result.result_id, live=ctx.live_versions)
    if waits.of(state) is waits.UNKNOWN:  # the compensator's own result settles it
        maker.add(
            AttemptResolved(
                **maker.header(
                    keys.attempt_resolved("compensate", result.segment, result.generation)
                ),
                kind="compensate",
                segment=result.segment,
                attempt=result.attempt,
                generation=result.generation,
                action="worker_result",
                idempotency_key=f"worker/{result.result_id}",
                fingerprint="worker",
                response=response(state, action="worker_result"),
            )
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
    next_step = state.attempt.next_step
    expected = list(range(next_step, next_step + len(result.steps)))
    if [s.step for s in result.steps] != expected:
        return f"steps {[s.step for s in result.steps]} do not continue from step {next_step}"
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
    reached = next_step + len(result.steps)
    end = spec.segment_end(next_step)
    last = end if spec.graph is not None else spec.last_step  # a graph step ends its lane
    if result.outcome == "completed" and (reached != last + 1 or end != last):
        return f"completed result stops at step {reached - 1}, its segment ends at {end}"
    if result.outcome == "suspended":
        return _suspension_problem(result, spec, reached, end)
    if result.outcome == "skipped" and (
        spec.graph is None or result.steps or not spec.graph.nodes[next_step].when
    ):
        return "only a graph step with a predicate (when) is skipped, before it runs"
    if result.outcome == "failed" and result.failed_step not in (None, reached):
        return f"failed_step {result.failed_step} is not the step after the completed ones"
    if result.outcome == "failed" and reached > end:
        return "failed result after every step of the segment completed"
    return ""


def _suspension_problem(result: SegmentResult, spec: PipelineSpec, reached: int, end: int) -> str:
    sleep = spec.steps[reached].sleeps if reached <= spec.last_step else None
    if reached == end and sleep is not None:
        return sleeps.wake_problem(result, sleep)
    awaits = spec.steps[reached].awaits if reached <= spec.last_step else None
    if reached != end or awaits is None:
        return f"suspended at step {reached}, but the segment's await step is {end}"
    if awaits.kind == "checkpoint" and result.requests:
        return "a checkpoint await sends no requests"
    if awaits.kind == "event":
        return event_waits.suspension_problem(result.requests, awaits.event_key)
    if awaits.kind in ("await", "child") and not awaits.itemized and len(result.requests) != 1:
        return f"a scalar await needs exactly one request, got {len(result.requests)}"
    for index, request in enumerate(result.requests):
        try:
            canonical_json(request)
        except InvalidPayloadError as exc:
            return f"request {index}: {exc}"
    return ""


# --- the fleet of workers -----------------------------------------------------------------


def decide_unblock(state: RunState | None, ctx: Context) -> Decision:
    """Dispatch the waiting attempt of a ``definition_blocked`` run if a live worker now
    loads its version (the engine asks when the fleet of workers changed)."""
    if state is None or state.terminal or state.quarantine is not None:
        return Decision()
    blocked = [
        lane for lane in (state, *state.lane_views()) if waits.of(lane) is waits.DEFINITION_BLOCKED
    ]
    spec = ctx.catalog.get(state.pipeline, state.pipeline_version)
    live = ctx.live_versions
    if not blocked or spec is None or (live is not None and (spec.name, spec.version) not in live):
        return Decision()
    first = blocked[0].attempt
    cause = f"fleet/{first.segment}/{first.generation}"
    maker = FactMaker(state, state.run_id, ctx.now, cause, live=live)
    control.deadline_first(maker, spec)
    if maker.current.stopping:
        control.settle_stop(maker, spec)
        return maker.decision()
    for lane in blocked:  # a chain's one attempt, or each blocked step of a graph run
        waiting = lane.attempt
        maker.lane = waiting.segment if state.lanes else None
        start_attempt(
            maker,
            spec,
            segment=waiting.segment,
            attempt=waiting.number,
            generation=waiting.generation,
            first_step=waiting.next_step,
            input=lane.last_output,
        )
    return maker.decision()


# --- timers -------------------------------------------------------------------------------


def decide_timer(timer: TimerFired, state: RunState | None, ctx: Context) -> Decision:
    """Turn a due row into facts, if the run still waits on it; otherwise do nothing."""
    entry = timer.entry
    if state is None or state.terminal or state.quarantine is not None:
        return Decision()  # a quarantined run arms no timer: a row left behind is stale
    spec = ctx.catalog.get(state.pipeline, state.pipeline_version)
    if spec is None:
        return Decision()  # kept due: it fires again once the pipeline version is loaded
    lane = _timer_lane(state, entry)
    maker = FactMaker(
        state, state.run_id, ctx.now, timer.cause_id, live=ctx.live_versions, lane=lane
    )
    decides = TIMER_DECISIONS.get(entry.kind, _stale)
    if entry.kind in _PAST_STOPPING:
        decides(maker, spec, entry, ctx)  # no stop applies to its wait: nor the deadline
        return maker.decision()
    control.deadline_first(maker, spec)
    decides(maker, spec, entry, ctx)
    control.settle_stop(maker, spec)
    return maker.decision()


def _timer_lane(state: RunState, entry: DueEntry) -> int | None:
    """The lane of a graph run a due row is about, if any: an attempt's, a boundary's
    and a sleep's rows name its segment (a lane's boundary is numbered by it). A
    compensator's rows name its step, but no lane is live once the unwind begins."""
    return state.lane_of(entry.scope)


#: What a due timer decides: its run is in ``maker.current``, the time in ``maker.now``.
TimerDecision = Callable[[FactMaker, PipelineSpec, DueEntry, Context], None]


def _stale(maker: FactMaker, spec: PipelineSpec, entry: DueEntry, ctx: Context) -> None:
    """Nothing: the run's deadline (``control.deadline_first`` decided it), or a timer
    of a kind this version does not know."""


def _not_started(maker: FactMaker, spec: PipelineSpec, entry: DueEntry, ctx: Context) -> None:
    progress.not_started(maker, spec, entry, ctx.max_infrastructure_losses)


def _heartbeat_lost(maker: FactMaker, spec: PipelineSpec, entry: DueEntry, ctx: Context) -> None:
    progress.heartbeat_lost(maker, spec, entry, ctx.max_infrastructure_losses)


def _interaction_due(maker: FactMaker, spec: PipelineSpec, entry: DueEntry, ctx: Context) -> None:
    state = maker.current
    waiting = waits.of(state) is waits.SUSPENDED and not state.stopping
    if not waiting and not waits.held_by_stop(state):
        return  # (the children a stop waits for time out as they would otherwise)
    interaction_id = keys.interaction_id(entry.scope, entry.ordinal)
    interaction = state.interactions.get(interaction_id)
    if interaction is None or interaction.status != "open":
        return
    if maker.now >= interaction.deadline_ms:
        timeout_interaction(maker, spec, ctx, interaction_id)


def _sleep_due(maker: FactMaker, spec: PipelineSpec, entry: DueEntry, ctx: Context) -> None:
    if sleeps.sleep_due(maker.current, entry, maker.now):
        sleeps.wake_up(maker, spec)  # (a stop fenced the sleep: its wait is no more)


def _publication_due(maker: FactMaker, spec: PipelineSpec, entry: DueEntry, ctx: Context) -> None:
    if waits.of(maker.current) is waits.PUBLISHING:
        publish(maker, spec, ctx.resume_keys)


def _timed_out(kind: AttemptKind) -> TimerDecision:
    def decide(maker: FactMaker, spec: PipelineSpec, entry: DueEntry, ctx: Context) -> None:
        _attempt_timed_out(maker, spec, kind, entry)

    return decide


def _retry_of(kind: AttemptKind) -> TimerDecision:
    def decide(maker: FactMaker, spec: PipelineSpec, entry: DueEntry, ctx: Context) -> None:
        _retry_due(maker, spec, kind, entry)

    return decide


#: Timer kind -> what it decides: each kind a wait arms (``waits.py``), and the run's
#: deadline. Each decision checks that the run still waits on the timer.
TIMER_DECISIONS: dict[TimerKind, TimerDecision] = {
    "schedule_to_start_timeout": _not_started,
    "heartbeat_timeout": _heartbeat_lost,
    **{timeout: _timed_out(kind) for kind, (timeout, _) in ATTEMPT_TIMERS.items()},
    **{retry: _retry_of(kind) for kind, (_, retry) in ATTEMPT_TIMERS.items()},
    "interaction_timeout": _interaction_due,
    "sleep": _sleep_due,
    "publication": _publication_due,
    "run_deadline": _stale,
}
#: The timers of waits past stopping (the terminal publication): decided without the
#: run's deadline first or a stop to settle after.
_PAST_STOPPING = frozenset(
    kind for wait in waits.WAITS.values() if not wait.stoppable for kind in wait.timers
)


def _attempt_timed_out(
    maker: FactMaker, spec: PipelineSpec, kind: AttemptKind, entry: DueEntry
) -> None:
    """A lost attempt: Unknown if it may have had effects (a compensator always may,
    and stops the unwind for an operator), else a retryable failure."""
    state = maker.current
    attempt = attempts.expired(state, kind, entry, maker.now)
    if attempt is None or attempt.started_step is None:
        return  # an attempt's own timeout runs from its start report only
    started = attempt.started_step
    if kind == COMPENSATE:
        attempts.mark_unknown(maker, attempt, step=attempt.scope)
        return
    if spec.segment_effectful(state.attempt.next_step):
        attempts.mark_unknown(maker, attempt, step=started)
        return
    error = (
        f"attempt {state.attempt.number} produced no result within its timeout "
        f"after step {started} started"
    )
    segment_failed(
        maker,
        spec,
        step=state.attempt.next_step,
        error=error,
        error_type=ATTEMPT_TIMEOUT,
        retryable=True,
    )


def _retry_due(maker: FactMaker, spec: PipelineSpec, kind: AttemptKind, entry: DueEntry) -> None:
    """The next attempt after a failure's backoff; stop intent fences forward retries
    (recovery has its own attempts: a compensator is retried while stopping)."""
    if kind == FORWARD and maker.current.stopping:
        return
    attempt = attempts.retry_due(maker.current, kind, entry, maker.now)
    if attempt is not None:
        attempts.start_next(maker, spec, attempt)
