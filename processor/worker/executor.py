"""Run one segment attempt: the steps of a work item, in order.

``execute`` runs an attempt in the calling thread (an ``async def`` step on an event
loop of its own); the worker calls ``execute_async`` on its event loop for attempts
with an ``async def`` step, with ``run_sync`` handing the sync steps to its pool.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import datetime
from functools import lru_cache, partial
from typing import Any

from processor.facts import payload
from processor.facts.models import Emission, SegmentResult, StepOutput, WorkItem
from processor.model.pipeline_spec import PipelineSpec
from processor.telemetry import logs, tracing
from processor.telemetry.metrics import observe_step
from processor.worker.attempts import RunningAttempt
from processor.worker.context import StepContext, StopFlag, is_async, wants_context
from processor.worker.emitting import EmissionBuffer
from processor.worker.pipeline import Application, NonRetryableError, Pipeline, Step

__all__ = [
    "NOT_RUN",
    "SyncRunner",
    "execute",
    "execute_async",
    "needs_loop",
    "not_run",
    "segment_steps",
]

logger = logging.getLogger(__name__)

#: How an async attempt runs a sync step function: in a pool, off the event loop.
SyncRunner = Callable[[Callable[[], Any]], Awaitable[Any]]
#: The error type of an attempt a worker did not run because its run was stopping.
NOT_RUN = "StopRequested"


def execute(
    item: WorkItem,
    app: Application,
    worker_id: str,
    traceparent: str | None = None,
    max_payload_bytes: int | None = None,
    *,
    attempt: RunningAttempt | None = None,
) -> SegmentResult:
    """Execute the item's steps until the segment ends or a step raises; each step in
    a span of the run's trace (``traceparent``) while OpenTelemetry is on.

    A step output (or await request) over ``max_payload_bytes`` fails the attempt,
    not retryably, with ``PayloadTooLarge`` naming its size: a result the broker
    would refuse is never produced. ``attempt`` (the worker's) gets the steps'
    starts and heartbeats and holds the stop flag of their contexts."""
    run = _Attempt.of(
        item,
        app,
        worker_id,
        traceparent=traceparent,
        max_payload_bytes=max_payload_bytes,
        attempt=attempt,
    )
    if isinstance(run, SegmentResult):
        return run
    if run.needs_loop():
        return asyncio.run(_drive(run, _inline))
    if item.kind == "compensate":
        return _compensate_sync(run)
    return _forward_sync(run)


async def execute_async(
    item: WorkItem,
    app: Application,
    worker_id: str,
    run_sync: SyncRunner,
    *,
    traceparent: str | None = None,
    max_payload_bytes: int | None = None,
    attempt: RunningAttempt | None = None,
) -> SegmentResult:
    """``execute`` on the running event loop; sync step functions go to ``run_sync``."""
    run = _Attempt.of(
        item,
        app,
        worker_id,
        traceparent=traceparent,
        max_payload_bytes=max_payload_bytes,
        attempt=attempt,
    )
    if isinstance(run, SegmentResult):
        return run
    return await _drive(run, run_sync)


def not_run(item: WorkItem, worker_id: str, why: str) -> SegmentResult:
    """The failed result of an attempt not run because its run was stopping (a cancel,
    the deadline): nothing ran, so nothing is retried or compensated for it."""
    return SegmentResult(
        result_id=str(uuid.uuid4()),
        run_id=item.run_id,
        segment=item.segment,
        attempt=item.attempt,
        generation=item.generation,
        worker_id=worker_id,
        kind=item.kind,
        steps=(),
        outcome="failed",
        failed_step=item.first_step,
        error=f"not run: {why}",
        error_type=NOT_RUN,
        retryable=False,
    )


def segment_steps(item: WorkItem, app: Application) -> list[Step] | None:
    """The steps an attempt of ``item`` runs (a compensation: the one step it undoes);
    None when its pipeline is not loaded here."""
    pipeline = app.pipeline(item.pipeline, item.pipeline_version)
    spec = app.get(item.pipeline, item.pipeline_version)
    if pipeline is None or spec is None:
        return None
    return [pipeline.steps[index] for index in _indexes(item, spec)]


def needs_loop(item: WorkItem, app: Application) -> bool:
    """Whether the item's attempt calls an ``async def`` function (runs on an event loop)."""
    pipeline = app.pipeline(item.pipeline, item.pipeline_version)
    spec = app.get(item.pipeline, item.pipeline_version)
    if pipeline is None or spec is None:
        return False
    return _has_async(pipeline, item.kind, _indexes(item, spec))


def _forward_sync(run: _Attempt) -> SegmentResult:
    value = payload.loads(run.item.input)
    for index in run.indexes():
        step = run.step(index)
        with run.step_scope(index, "processor.step") as span:
            try:
                if not run.guard_holds(step, value):
                    return run.skipped()
                value = run.timed(step, partial(run.call, step.function, value, index))
                ended = run.after(index, step, value)
            except Exception as exc:  # a step's failure is data, reported to the processor
                return run.failure(index, exc, span)
        if ended is not None:
            return ended
    return run.completed()


def _compensate_sync(run: _Attempt) -> SegmentResult:
    index = run.item.first_step
    step = run.step(index)
    compensator = step.compensator
    if compensator is None:
        return run.no_compensator(step)
    with run.step_scope(index, "processor.compensate") as span:
        try:
            value = payload.loads(run.item.input)
            run.timed(step, partial(run.call, compensator, value, index))
        except Exception as exc:  # a compensator's failure is data, reported to the processor
            return run.failure(index, exc, span)
    return run.compensated()


async def _drive(run: _Attempt, run_sync: SyncRunner) -> SegmentResult:
    item = run.item
    with logs.run_context(item.run_id, item.pipeline, item.first_step, item.attempt):
        if run.item.kind == "compensate":
            return await _compensate_async(run, run_sync)
        return await _forward_async(run, run_sync)


async def _forward_async(run: _Attempt, run_sync: SyncRunner) -> SegmentResult:
    value = payload.loads(run.item.input)
    for index in run.indexes():
        step = run.step(index)
        with run.step_scope(index, "processor.step") as span:
            try:
                if not run.guard_holds(step, value):
                    return run.skipped()
                value = await run.timed_async(step, step.function, value, index, run_sync)
                ended = run.after(index, step, value)
            except Exception as exc:  # a step's failure is data, reported to the processor
                return run.failure(index, exc, span)
        if ended is not None:
            return ended
    return run.completed()


async def _compensate_async(run: _Attempt, run_sync: SyncRunner) -> SegmentResult:
    index = run.item.first_step
    step = run.step(index)
    if step.compensator is None:
        return run.no_compensator(step)
    with run.step_scope(index, "processor.compensate") as span:
        try:
            value = payload.loads(run.item.input)
            await run.timed_async(step, step.compensator, value, index, run_sync)
        except Exception as exc:  # a compensator's failure is data, reported to the processor
            return run.failure(index, exc, span)
    return run.compensated()


async def _inline(function: Callable[[], Any]) -> Any:
    """``execute``'s runner of sync steps on its private loop: in the calling thread."""
    return function()


class _Attempt:
    """One attempt being executed: what it needs, and the results it may end with."""

    def __init__(
        self,
        item: WorkItem,
        pipeline: Pipeline,
        app: Application,
        common: dict[str, Any],
        *,
        traceparent: str | None,
        max_payload_bytes: int | None,
        attempt: RunningAttempt | None,
    ) -> None:
        spec = app.get(item.pipeline, item.pipeline_version)
        assert spec is not None  # the pipeline exists, so does its spec
        self.item = item
        self.pipeline = pipeline
        self.spec = spec
        self.common = common
        self.outputs: list[StepOutput] = []
        self._traceparent = traceparent
        self._max_payload_bytes = max_payload_bytes
        self._attempt = attempt
        self._stop = attempt.stop if attempt is not None else StopFlag()
        self.emissions = EmissionBuffer(max_payload_bytes)

    @classmethod
    def of(
        cls,
        item: WorkItem,
        app: Application,
        worker_id: str,
        *,
        traceparent: str | None,
        max_payload_bytes: int | None,
        attempt: RunningAttempt | None,
    ) -> _Attempt | SegmentResult:
        """The attempt, or the failed result of a pipeline version not loaded here."""
        common = {
            "result_id": str(uuid.uuid4()),
            "run_id": item.run_id,
            "segment": item.segment,
            "attempt": item.attempt,
            "generation": item.generation,
            "worker_id": worker_id,
        }
        pipeline = app.pipeline(item.pipeline, item.pipeline_version)
        if pipeline is None:
            return SegmentResult(
                **common,
                steps=(),
                outcome="failed",
                failed_step=item.first_step,
                error=f"pipeline {item.pipeline!r} v{item.pipeline_version} is not loaded here",
                error_type="UnknownPipeline",
                retryable=True,
            )
        return cls(
            item,
            pipeline,
            app,
            common,
            traceparent=traceparent,
            max_payload_bytes=max_payload_bytes,
            attempt=attempt,
        )

    def needs_loop(self) -> bool:
        return _has_async(self.pipeline, self.item.kind, self.indexes())

    def indexes(self) -> range:
        return _indexes(self.item, self.spec)

    def step(self, index: int) -> Step:
        return self.pipeline.steps[index]

    def call(self, function: Callable[..., Any], value: Any, index: int) -> Any:
        """Call a step function; with the context of step ``index`` if it declares a
        second parameter (only then is the context made)."""
        if wants_context(function):
            return function(value, self.context(index))
        return function(value)

    def context(self, index: int) -> StepContext:
        """The context of step ``index`` in this attempt."""
        item = self.item
        return StepContext(
            run_id=item.run_id,
            pipeline=item.pipeline,
            pipeline_version=item.pipeline_version,
            step=self.step(index).spec.name,
            step_index=index,
            kind=item.kind,
            attempt=item.attempt,
            generation=item.generation,
            deadline_ms=item.run_deadline_ms,
            stop=self._stop,
            heartbeat=None if self._attempt is None else self._attempt.heartbeat,
            emit=self.emissions.add,
        )

    @contextmanager
    def step_scope(self, index: int, prefix: str) -> Iterator[tracing.SpanHandle]:
        """Around one step: the log context names it, its span, the worker knows it runs."""
        step = self.step(index)
        logs.bind_step(index)
        with self._span(index, f"{prefix} {step.spec.name}") as span:
            if self._attempt is not None:
                self._attempt.step_began(index, step.spec)
            try:
                yield span
            finally:
                if self._attempt is not None:
                    self._attempt.step_ended()

    def _span(self, index: int, name: str) -> AbstractContextManager[tracing.SpanHandle]:
        if not tracing.enabled() or self._traceparent is None:
            return nullcontext(tracing.SpanHandle(None, self._traceparent))
        return tracing.step_span(self._traceparent, name, **_attributes(self.item, index))

    def timed(self, step: Step, call: Callable[[], Any]) -> Any:
        """Call the step function; record how long it took, whether it returned or raised."""
        began = time.perf_counter()
        try:
            return call()
        finally:
            observe_step(self.item.pipeline, step.spec.name, time.perf_counter() - began)

    async def timed_async(
        self,
        step: Step,
        function: Callable[..., Any],
        value: Any,
        index: int,
        run_sync: SyncRunner,
    ) -> Any:
        """``timed`` for an attempt on the event loop: awaited, or run by ``run_sync``."""
        began = time.perf_counter()
        try:
            if is_async(function):
                return await self.call(function, value, index)
            return await run_sync(partial(self.call, function, value, index))
        finally:
            observe_step(self.item.pipeline, step.spec.name, time.perf_counter() - began)

    def after(self, index: int, step: Step, value: Any) -> SegmentResult | None:
        """Record a step's output; the suspended result of an await or a sleep step."""
        if step.spec.sleeps is not None:  # the processor keeps the timer
            wake = () if step.spec.sleeps.duration_ms is not None else _wake(value)
            return self._suspended(wake)
        if step.spec.awaits is not None:
            requests = _requests(value, step.spec.awaits.kind, step.spec.awaits.itemized)
            for request in requests:
                payload.check_size(request, self._max_payload_bytes, _what(step, "request"))
            return self._suspended(requests)
        encoded = payload.dumps(value)
        payload.check_size(encoded, self._max_payload_bytes, _what(step, "output"))
        self.outputs.append(StepOutput(step=index, output=encoded))
        self.emissions.step_returned()
        return None

    def _suspended(self, requests: tuple[bytes, ...]) -> SegmentResult:
        self.emissions.step_returned()  # the await (or sleep) step returned
        return SegmentResult(
            **self.common,
            steps=tuple(self.outputs),
            outcome="suspended",
            requests=requests,
            emits=self._emits(),
        )

    def _emits(self) -> tuple[Emission, ...]:
        return tuple(self.emissions.kept)

    def completed(self) -> SegmentResult:
        return SegmentResult(
            **self.common, steps=tuple(self.outputs), outcome="completed", emits=self._emits()
        )

    def guard_holds(self, step: Step, value: Any) -> bool:
        """Whether a graph step may run: its ``when`` predicate, if any, on its input."""
        return step.predicate is None or bool(step.predicate(value))

    def skipped(self) -> SegmentResult:
        """A graph step whose predicate was false: it did not run."""
        return SegmentResult(
            **self.common, steps=tuple(self.outputs), outcome="skipped", emits=self._emits()
        )

    def failure(self, index: int, exc: Exception, span: tracing.SpanHandle) -> SegmentResult:
        """The failed result of a step (or compensator) that raised ``exc``."""
        what = "compensator of step" if self.item.kind == "compensate" else "step"  # logs
        logger.info("%s %s of run %s failed: %r", what, index, self.item.run_id, exc)
        span.fail(type(exc).__name__, str(exc) or repr(exc))
        self.emissions.step_raised()
        return SegmentResult(
            **self.common,
            kind=self.item.kind,
            emits=self._emits(),
            steps=tuple(self.outputs),
            outcome="failed",
            failed_step=index,
            error=str(exc) or repr(exc),
            error_type=type(exc).__name__,
            retryable=not isinstance(exc, (NonRetryableError, payload.InvalidPayloadError)),
        )

    def no_compensator(self, step: Step) -> SegmentResult:
        return SegmentResult(
            **self.common,
            kind="compensate",
            steps=(),
            outcome="failed",
            failed_step=self.item.first_step,
            error=f"step {step.spec.name!r} has no compensator here",
            error_type="MissingCompensator",
            retryable=False,
        )

    def compensated(self) -> SegmentResult:
        return SegmentResult(**self.common, kind="compensate", steps=(), outcome="completed")


def _indexes(item: WorkItem, spec: PipelineSpec) -> range:
    """The indexes of the steps an attempt of ``item`` runs: its segment's, or the one
    step a compensation undoes."""
    if item.kind == "compensate":
        return range(item.first_step, item.first_step + 1)
    return range(item.first_step, spec.segment_end(item.first_step) + 1)


@lru_cache(maxsize=4096)
def _has_async(pipeline: Pipeline, kind: str, indexes: range) -> bool:
    """Whether what an attempt calls of the steps at ``indexes`` (their functions, or
    a compensation's compensator) is ``async def``; the same for every attempt."""
    steps = [pipeline.steps[index] for index in indexes]
    if kind == "compensate":
        return any(s.compensator is not None and is_async(s.compensator) for s in steps)
    return any(is_async(s.function) for s in steps)


def _what(step: Step, part: str) -> str:
    return f"{part} of step {step.spec.name!r}"


def _attributes(item: WorkItem, step: int) -> dict[str, str | int]:
    """A step span's attributes (``processor.<name>``)."""
    return {
        "run_id": item.run_id,
        "pipeline": item.pipeline,
        "segment": item.segment,
        "attempt": item.attempt,
        "step": step,
    }


def _wake(value: object) -> tuple[bytes]:
    """A sleep_until step's wake time as its one request: epoch ms as JSON, or null."""
    if value is None:
        return (b"null",)
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise TypeError("sleep_until needs an aware datetime (with a tzinfo), not a naive one")
        return (payload.dumps(int(value.timestamp() * 1000)),)
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return (payload.dumps(int(value)),)
    raise TypeError(f"sleep_until returns epoch ms, an aware datetime or None, not {value!r}")


def _requests(value: object, kind: str, itemized: bool) -> tuple[bytes, ...]:
    """The await step's requests: none for a checkpoint, one, or one per item."""
    if kind == "checkpoint":
        return ()
    if not itemized:
        return (payload.dumps(value),)
    if not isinstance(value, list | tuple):
        raise TypeError("an itemized await step must return a list of requests")
    return tuple(payload.dumps(item) for item in value)
