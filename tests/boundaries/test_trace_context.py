"""A run's W3C traceparent follows it, and with OpenTelemetry on one trace covers it.

Both transports: a processor and in-process workers (``Host``), a real ``Client``;
the traceparent given at submit is stored with the run (RunSubmitted), carried as
the ``traceparent`` header of its work items, results, request and outcome; and
with an SDK tracer provider (an in-memory exporter) the submit, each step, the
await and the outcome are spans of that one trace.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from pydantic import SecretStr

from processor.clients.client import Client
from processor.config.settings import Settings
from processor.engine.host import Host
from processor.facts.codec import codec
from processor.facts.models import BoundaryRequest, RunSubmitted
from processor.facts.topics import TopicName
from processor.facts.traceparent import trace_id_of
from processor.telemetry import tracing
from processor.transport.base import Record
from processor.transport.deployment import Deployment
from tests.apps.boundary_pipelines import app
from tests.apps.support import read_topic, run_facts, wait_until
from tests.boundaries.conftest import SECRET

GIVEN = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@dataclass
class Running:
    deployment: Deployment
    client: Client

    def records(self, topic: TopicName, run_id: str) -> list[Record]:
        """The records of ``topic`` keyed by ``run_id``."""
        topology = self.deployment.topology
        reader = self.deployment.transport.reader()
        try:
            found = read_topic(reader, topology.name(topic), topology.partitions)
            return [r for r in found if r.key == run_id.encode()]
        finally:
            reader.close()

    def run_to_the_end(self, traceparent: str | None) -> str:
        """Submit a ``scalar`` run, answer its request, wait for its outcome."""
        receipt = self.client.submit("scalar", {"n": 7}, traceparent=traceparent)
        assert receipt.created
        requests = wait_until(
            lambda: self.records(TopicName.REQUESTS, receipt.run_id), 60, "the request"
        )
        request = codec().decode_as(requests[0].value, BoundaryRequest)
        self.client.complete(request.resume_token, {"yes": True})
        result = self.client.wait(receipt.run_id, timeout_s=60)
        assert result.status == "succeeded"
        wait_until(lambda: self.records(TopicName.OUTCOMES, receipt.run_id), 30, "the outcome")
        return receipt.run_id


@pytest.fixture
def running(settings: Settings) -> Iterator[Running]:
    secret = SecretStr(SECRET.decode())
    deployment = Deployment.from_settings(settings.model_copy(update={"resume_secret": secret}))
    host = Host(deployment, app, workers=1)
    host.start()
    client = Client(deployment.transport, deployment.topology, deployment.settings.state_dir)
    try:
        yield Running(deployment, client)
        assert not host.errors
    finally:
        host.stop()
        client.close()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Spans on, into memory (a provider of the test's own: the global one is untouched)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    try:
        yield exporter
    finally:
        tracing.disable()
        provider.shutdown()


def _header(record: Record) -> str | None:
    values = [v.decode() for k, v in record.headers if k == "traceparent"]
    assert len(values) <= 1
    return values[0] if values else None


def test_the_given_traceparent_travels_with_the_run(running: Running) -> None:
    run_id = running.run_to_the_end(GIVEN)
    reader = running.deployment.transport.reader()
    try:
        submitted = run_facts(reader, running.deployment, run_id)[0]
    finally:
        reader.close()
    assert isinstance(submitted, RunSubmitted) and submitted.traceparent == GIVEN
    assert running.client.current(run_id).state.traceparent == GIVEN  # type: ignore[union-attr]
    for topic in (TopicName.WORK, TopicName.RESULTS, TopicName.REQUESTS, TopicName.OUTCOMES):
        records = running.records(topic, run_id)
        assert records, topic
        assert [_header(r) for r in records] == [GIVEN] * len(records), topic
    # Not on what the run's own facts or the client's replies are.
    assert all(_header(r) is None for r in running.records(TopicName.FACTS, run_id))


def test_without_a_traceparent_none_is_invented(running: Running) -> None:
    assert not tracing.enabled()
    run_id = running.run_to_the_end(None)
    assert running.client.current(run_id).state.traceparent is None  # type: ignore[union-attr]
    for topic in (TopicName.WORK, TopicName.RESULTS, TopicName.REQUESTS, TopicName.OUTCOMES):
        assert all(_header(r) is None for r in running.records(topic, run_id)), topic


def test_a_malformed_traceparent_is_refused_by_the_client(running: Running) -> None:
    with pytest.raises(ValueError, match="not a W3C traceparent"):
        running.client.submit("scalar", {"n": 1}, traceparent="00-abc-def-01")


def _by_name(finished: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    found: dict[str, list[ReadableSpan]] = {}
    for span in finished:
        found.setdefault(span.name, []).append(span)
    return found


def _of_run(exporter: InMemorySpanExporter, run_id: str) -> dict[str, list[ReadableSpan]]:
    spans = exporter.get_finished_spans()
    return _by_name(
        tuple(s for s in spans if (s.attributes or {}).get("processor.run_id") == run_id)
    )


def _wait_spans(exporter: InMemorySpanExporter, run_id: str) -> dict[str, list[ReadableSpan]]:
    wanted = {
        "processor.submit",
        "processor.step prepare",
        "processor.step ask",
        "processor.step finish",
        "processor.await",
        "processor.outcome",
    }
    return wait_until(
        lambda: (found := _of_run(exporter, run_id)).keys() >= wanted and found,
        30,
        "every span of the run",
    )


def _trace_id(span: ReadableSpan) -> str:
    assert span.context is not None
    return f"{span.context.trace_id:032x}"


def test_one_trace_covers_submit_steps_await_and_outcome(
    running: Running, spans: InMemorySpanExporter
) -> None:
    run_id = running.run_to_the_end(GIVEN)
    found = _wait_spans(spans, run_id)
    every = [span for named in found.values() for span in named]
    assert {_trace_id(span) for span in every} == {trace_id_of(GIVEN)}
    (submit,) = found["processor.submit"]
    assert submit.parent is not None and f"{submit.parent.span_id:016x}" == GIVEN.split("-")[2]
    assert submit.context is not None
    # Everything the processor and the workers did is a child of the submit span.
    for span in every:
        if span is not submit:
            assert span.parent is not None and span.parent.span_id == submit.context.span_id
    (awaited,) = found["processor.await"]
    attributes: dict[str, Any] = dict(awaited.attributes or {})
    assert (attributes["processor.target"], attributes["processor.outcome"]) == ("echo", "success")
    assert awaited.start_time is not None and awaited.end_time is not None
    # From the request (the ask step's end) to the completion.
    (ask,) = found["processor.step ask"]
    assert ask.end_time is not None
    assert abs(awaited.start_time - ask.end_time) < 5_000_000_000
    (outcome,) = found["processor.outcome"]
    assert dict(outcome.attributes or {})["processor.status"] == "succeeded"
    # The stored traceparent is the submit span's: the run's trace continues from it.
    state = running.client.current(run_id).state
    assert state is not None and state.traceparent is not None
    assert int(state.traceparent.split("-")[2], 16) == submit.context.span_id


def test_with_spans_on_and_no_traceparent_the_submit_span_starts_the_trace(
    running: Running, spans: InMemorySpanExporter
) -> None:
    run_id = running.run_to_the_end(None)
    found = _wait_spans(spans, run_id)
    (submit,) = found["processor.submit"]
    assert submit.parent is None
    assert len({_trace_id(span) for named in found.values() for span in named}) == 1
    state = running.client.current(run_id).state
    assert state is not None and state.traceparent is not None
    assert trace_id_of(state.traceparent) == _trace_id(submit)


def test_a_refused_submit_is_an_error_span(running: Running, spans: InMemorySpanExporter) -> None:
    receipt = running.client.submit("no-such-pipeline", {}, traceparent=GIVEN)
    assert receipt.refusal == "unknown_pipeline"
    (submit,) = [s for s in spans.get_finished_spans() if s.name == "processor.submit"]
    assert submit.status.status_code is StatusCode.ERROR
    assert "unknown_pipeline" in (submit.status.description or "")
