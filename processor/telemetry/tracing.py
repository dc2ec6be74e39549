"""OpenTelemetry spans of a run's trace: optional, and free when off.

A run's W3C ``traceparent`` travels with it whether or not spans are emitted
(RunSubmitted stores it; work items, results, requests and the outcome carry it
as a Kafka header). This module emits spans into that trace once ``enable`` (or
``configure`` with ``PROCESSOR_OTEL=true``) has been called with the
OpenTelemetry SDK installed (``pip install 'processor[otel]'``):

- ``processor.submit``: the client's submit (its context becomes the run's
  traceparent, child of the caller's one when given);
- ``processor.step <name>`` / ``processor.compensate <name>``: each step
  attempt, in the worker that runs it;
- ``processor.await``: an interaction, from its request to its completion or
  timeout (recorded by the processor when it admits the completion);
- ``processor.outcome``: the run, from its acceptance to its terminal fact.

``opentelemetry`` is imported only by ``enable`` and ``configure``; while
tracing is off every function here is a no-op that touches nothing.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = [
    "SpanHandle",
    "configure",
    "disable",
    "enable",
    "enabled",
    "record_span",
    "step_span",
    "submit_span",
]

logger = logging.getLogger(__name__)

Attributes = Mapping[str, str | int | bool]


@dataclass
class _Tracing:
    tracer: Any = None  # an opentelemetry Tracer while enabled
    propagator: Any = None


_STATE = _Tracing()


def enable(provider: Any | None = None) -> None:
    """Emit spans through ``provider`` (an SDK ``TracerProvider``), or the global one.

    Raises ImportError without ``opentelemetry-api``.
    """
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    source = provider if provider is not None else trace.get_tracer_provider()
    _STATE.tracer = source.get_tracer("processor")
    _STATE.propagator = TraceContextTextMapPropagator()


def disable() -> None:
    """Stop emitting spans (traceparents still travel with runs)."""
    _STATE.tracer = None


def enabled() -> bool:
    """Whether spans are emitted."""
    return _STATE.tracer is not None


def configure(otel: bool, service_name: str = "processor") -> bool:
    """What the CLI does with ``PROCESSOR_OTEL``: when true, emit spans through the
    global tracer provider, first setting up an SDK one (service ``service_name``,
    exporting by OTLP/HTTP when ``opentelemetry-exporter-otlp-proto-http`` is
    installed, to stderr otherwise) unless the program set one up. Returns whether
    spans are on."""
    if not otel:
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        logger.warning("PROCESSOR_OTEL is true but opentelemetry-sdk is not installed: no spans")
        return False
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        provider.add_span_processor(BatchSpanProcessor(_exporter()))
        trace.set_tracer_provider(provider)
    enable()
    return True


def _exporter() -> Any:
    try:  # an optional package: OTLP to OTEL_EXPORTER_OTLP_ENDPOINT (its own settings)
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
            OTLPSpanExporter,
        )
    except ImportError:
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter(out=sys.stderr)  # stdout is the CLI's output
    return OTLPSpanExporter()


def _context(traceparent: str | None) -> Any:
    """The OpenTelemetry context whose parent is ``traceparent`` (None: a new trace)."""
    if traceparent is None:
        return None
    return _STATE.propagator.extract({"traceparent": traceparent})


def _traceparent_of(span: Any) -> str | None:
    from opentelemetry import trace

    carrier: dict[str, str] = {}
    _STATE.propagator.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent")


@dataclass
class SpanHandle:
    """The span of a ``with`` block (or nothing, while tracing is off)."""

    span: Any = None
    #: The traceparent that children of this span take (the given one when off).
    traceparent: str | None = None

    def annotate(self, **attributes: str | int | bool) -> None:
        """Add attributes (``processor.<name>``) to the span."""
        if self.span is not None:
            self.span.set_attributes({f"processor.{k}": v for k, v in attributes.items()})

    def fail(self, error_type: str, message: str) -> None:
        """Mark the span failed (a step's exception is data, caught by the executor)."""
        if self.span is not None:
            from opentelemetry.trace import Status, StatusCode

            self.span.set_status(Status(StatusCode.ERROR, f"{error_type}: {message}"))


def _attributes(attributes: Attributes) -> dict[str, Any]:
    return {f"processor.{k}": v for k, v in attributes.items()}


@contextmanager
def submit_span(traceparent: str | None, **attributes: str | int | bool) -> Iterator[SpanHandle]:
    """The client's submit: a span child of ``traceparent`` (or a new trace) whose
    ``traceparent`` the run is submitted with; while off, ``traceparent`` as given."""
    if _STATE.tracer is None:
        yield SpanHandle(None, traceparent)
        return
    from opentelemetry.trace import SpanKind

    with _STATE.tracer.start_as_current_span(
        "processor.submit",
        context=_context(traceparent),
        kind=SpanKind.PRODUCER,
        attributes=_attributes(attributes),
    ) as span:
        yield SpanHandle(span, _traceparent_of(span))


@contextmanager
def step_span(
    traceparent: str | None, name: str, **attributes: str | int | bool
) -> Iterator[SpanHandle]:
    """A step attempt in a worker, child of the run's ``traceparent``; current while
    the step runs, so spans the step function makes are its children. Nothing
    without a traceparent or while off."""
    if _STATE.tracer is None or traceparent is None:
        yield SpanHandle(None, traceparent)
        return
    from opentelemetry.trace import SpanKind

    with _STATE.tracer.start_as_current_span(
        name,
        context=_context(traceparent),
        kind=SpanKind.CONSUMER,
        attributes=_attributes(attributes),
    ) as span:
        yield SpanHandle(span, _traceparent_of(span))


def record_span(
    name: str,
    traceparent: str,
    start_ms: int,
    end_ms: int,
    attributes: Attributes,
    *,
    error: str | None = None,
) -> None:
    """A span of the run's trace that already happened (start and end in epoch ms),
    child of ``traceparent``: the processor records its spans after its commit."""
    if _STATE.tracer is None:
        return
    span = _STATE.tracer.start_span(
        name,
        context=_context(traceparent),
        attributes=_attributes(attributes),
        start_time=start_ms * 1_000_000,
    )
    if error is not None:
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, error))
    span.end(end_time=max(end_ms, start_ms) * 1_000_000)
