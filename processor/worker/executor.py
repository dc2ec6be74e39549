"""Run one segment attempt: the steps of a work item, in order, in this process."""

from __future__ import annotations

import logging
import time
import uuid
from datetime import datetime
from typing import Any

from processor.facts import payload
from processor.facts.models import SegmentResult, StepOutput, WorkItem
from processor.telemetry import logs, tracing
from processor.telemetry.metrics import observe_step
from processor.worker.pipeline import Application, NonRetryableError, Step

__all__ = ["execute"]

logger = logging.getLogger(__name__)


def execute(
    item: WorkItem,
    app: Application,
    worker_id: str,
    traceparent: str | None = None,
    max_payload_bytes: int | None = None,
) -> SegmentResult:
    """Execute the item's steps until the segment ends or a step raises; each step in
    a span of the run's trace (``traceparent``) while OpenTelemetry is on.

    A step output (or await request) over ``max_payload_bytes`` fails the attempt,
    not retryably, with ``PayloadTooLarge`` naming its size: a result the broker
    would refuse is never produced."""
    pipeline = app.pipeline(item.pipeline, item.pipeline_version)
    common = {
        "result_id": str(uuid.uuid4()),
        "run_id": item.run_id,
        "segment": item.segment,
        "attempt": item.attempt,
        "generation": item.generation,
        "worker_id": worker_id,
    }
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
    if item.kind == "compensate":
        step = pipeline.steps[item.first_step]
        name = f"processor.compensate {step.spec.name}"
        with tracing.step_span(traceparent, name, **_attributes(item, item.first_step)) as span:
            return _compensate(item, step, common, span)
    outputs: list[StepOutput] = []
    value = payload.loads(item.input)
    spec = app.get(item.pipeline, item.pipeline_version)
    assert spec is not None  # the pipeline exists, so does its spec
    for index in range(item.first_step, spec.segment_end(item.first_step) + 1):
        step = pipeline.steps[index]
        logs.bind_step(index)
        name = f"processor.step {step.spec.name}"
        with tracing.step_span(traceparent, name, **_attributes(item, index)) as span:
            try:
                value = _run_step(item.pipeline, step, value)
                if step.spec.sleeps is not None:  # the processor keeps the timer
                    wake = () if step.spec.sleeps.duration_ms is not None else _wake(value)
                    return SegmentResult(
                        **common, steps=tuple(outputs), outcome="suspended", requests=wake
                    )
                if step.spec.awaits is not None:
                    requests = _requests(value, step.spec.awaits.kind, step.spec.awaits.itemized)
                    for request in requests:
                        payload.check_size(request, max_payload_bytes, _what(step, "request"))
                    return SegmentResult(
                        **common, steps=tuple(outputs), outcome="suspended", requests=requests
                    )
                encoded = payload.dumps(value)
                payload.check_size(encoded, max_payload_bytes, _what(step, "output"))
            except Exception as exc:  # a step's failure is data, reported to the processor
                logger.info("step %s of run %s failed: %r", index, item.run_id, exc)
                span.fail(type(exc).__name__, str(exc) or repr(exc))
                return SegmentResult(
                    **common,
                    steps=tuple(outputs),
                    outcome="failed",
                    failed_step=index,
                    error=str(exc) or repr(exc),
                    error_type=type(exc).__name__,
                    retryable=not isinstance(exc, (NonRetryableError, payload.InvalidPayloadError)),
                )
        outputs.append(StepOutput(step=index, output=encoded))
    return SegmentResult(**common, steps=tuple(outputs), outcome="completed")


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


def _run_step(pipeline: str, step: Step, value: Any) -> Any:
    """Call the step function; record how long it took, whether it returned or raised."""
    began = time.perf_counter()
    try:
        return step.function(value)
    finally:
        observe_step(pipeline, step.spec.name, time.perf_counter() - began)


def _compensate(
    item: WorkItem, step: Step, common: dict[str, Any], span: tracing.SpanHandle
) -> SegmentResult:
    """Run one step's compensator with the step's output."""
    if step.compensator is None:
        return SegmentResult(
            **common,
            kind="compensate",
            steps=(),
            outcome="failed",
            failed_step=item.first_step,
            error=f"step {step.spec.name!r} has no compensator here",
            error_type="MissingCompensator",
            retryable=False,
        )
    try:
        step.compensator(payload.loads(item.input))
    except Exception as exc:  # a compensator's failure is data, reported to the processor
        logger.info(
            "compensator of step %s of run %s failed: %r", item.first_step, item.run_id, exc
        )
        span.fail(type(exc).__name__, str(exc) or repr(exc))
        return SegmentResult(
            **common,
            kind="compensate",
            steps=(),
            outcome="failed",
            failed_step=item.first_step,
            error=str(exc) or repr(exc),
            error_type=type(exc).__name__,
            retryable=not isinstance(exc, NonRetryableError),
        )
    return SegmentResult(**common, kind="compensate", steps=(), outcome="completed")


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
