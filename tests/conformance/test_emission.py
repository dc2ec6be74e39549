"""Emission on both transports: a processor loop driven by hand (``LoopHarness``), a
fake clock, and the worker played by the test (``execute``).

A step's events (``ctx.emit``) are published once, with the commit that records
them as ``EventEmitted`` facts, under ids derived from the run, segment, step and
index; a refused result (stale attempt, duplicate delivery) and a failed step
publish nothing; an undeclared topic fails the step, not retried.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from processor.facts.models import EventEmitted, SegmentFailed, WorkItem
from processor.facts.topics import TopicName
from processor.model.emission import UNDECLARED_TOPIC, event_id
from processor.transport.base import Record
from processor.transport.deployment import ensure_topics
from processor.worker.executor import execute
from tests.apps.emission_pipelines import build_app
from tests.apps.support import FakeClock, LoopHarness, read_topic, transport_settings


class Emitting:
    """A harness on one transport and the topic its pipelines emit to."""

    def __init__(self, harness: LoopHarness, topic: str) -> None:
        self.harness = harness
        self.topic = topic

    def events(self, run_id: str) -> list[Record]:
        """The committed records of the emit topic whose run-id header names ``run_id``."""
        records = read_topic(
            self.harness.reader, self.topic, self.harness.deployment.topology.partitions
        )
        return [r for r in records if dict(r.headers).get("run-id") == run_id.encode()]

    def work(self, run_id: str) -> WorkItem:
        """The next work item of ``run_id`` dispatched."""

        def found() -> WorkItem | None:
            self.harness.new_work()
            items = [i for i in self.harness.work_items if i.run_id == run_id]
            return items[-1] if items else None

        return self.harness.drive(found, f"work of {run_id}")

    def next_work(self, run_id: str, after: WorkItem) -> WorkItem:
        def found() -> WorkItem | None:
            self.harness.new_work()
            items = [i for i in self.harness.work_items if i.run_id == run_id]
            return items[-1] if items and items[-1] != after else None

        return self.harness.drive(found, f"the next work of {run_id}")

    def ended(self, run_id: str) -> str:
        def status() -> str | None:
            state = self.harness.loop_state(run_id)
            return state.status if state is not None and state.terminal else None

        return self.harness.drive(status, f"{run_id} terminal")


@pytest.fixture(scope="module", params=["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def emitting(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Emitting]:
    settings = transport_settings(str(request.param), tmp_path_factory.mktemp("emission"))
    topic = f"{settings.topic_prefix}emitted.{uuid.uuid4().hex[:8]}"
    harness = LoopHarness(settings.data_dir, build_app(topic), FakeClock(), settings=settings)
    try:
        yield Emitting(harness, topic)
    finally:
        harness.close()


def _values(records: list[Record]) -> list[object]:
    return [json.loads(r.value or b"") for r in records]


def test_a_steps_events_are_published_once_with_derived_ids(emitting: Emitting) -> None:
    h = emitting.harness
    run_id = h.submit("emitter", "a")
    item = emitting.work(run_id)
    result = h.complete(item)
    assert emitting.ended(run_id) == "succeeded"

    events = emitting.events(run_id)
    assert sorted(map(json.dumps, _values(events))) == sorted(
        map(json.dumps, [{"announced": "a"}, {"again": "a"}, {"finished": "a"}])
    )
    expected = {
        event_id(run_id, item.segment, 0, 0),
        event_id(run_id, item.segment, 0, 1),
        event_id(run_id, item.segment, 1, 0),
    }
    assert {dict(r.headers)["event-id"].decode() for r in events} == expected
    assert {r.key for r in events} == {run_id.encode(), b"order-7"}
    emitted = [f for f in h.facts(run_id) if isinstance(f, EventEmitted)]
    assert {f.event_id for f in emitted} == expected
    assert [(f.step, f.index) for f in emitted] == [(0, 0), (0, 1), (1, 0)]

    # The same result delivered again is refused: nothing is published twice.
    again = h.produce(TopicName.RESULTS, run_id, result.value or b"")
    refusal = h.drive(lambda: h.rejected.find(again), "the duplicate result refused")
    assert refusal.reason == "stale_attempt"
    assert len(emitting.events(run_id)) == 3


def test_a_stale_attempts_result_publishes_nothing(emitting: Emitting) -> None:
    h = emitting.harness
    run_id = h.submit("slow_emitter", "s")
    first = emitting.work(run_id)
    expires_ms = h.started(first)  # a worker started it and never answers in time
    h.clock.advance_to(expires_ms)  # the attempt times out; a retry is dispatched
    second = emitting.next_work(run_id, first)
    assert (second.segment, second.attempt) == (first.segment, 2)

    stale = h.complete(first)  # the first attempt's worker answers late
    refusal = h.drive(lambda: h.rejected.find(stale), "the stale result refused")
    assert refusal.reason == "stale_attempt"
    assert emitting.events(run_id) == []

    h.complete(second)
    assert emitting.ended(run_id) == "succeeded"
    (event,) = emitting.events(run_id)
    # The id does not depend on the attempt: the first attempt's would have been the same.
    assert dict(event.headers)["event-id"].decode() == event_id(run_id, first.segment, 0, 0)


def test_a_failed_steps_events_are_dropped_and_its_retry_publishes_once(
    emitting: Emitting,
) -> None:
    h = emitting.harness
    run_id = h.submit("flaky_emitter", "f")
    first = emitting.work(run_id)
    h.complete(first)  # emits, then raises
    second = emitting.next_work(run_id, first)
    h.complete(second)
    assert emitting.ended(run_id) == "succeeded"
    assert _values(emitting.events(run_id)) == [{"attempt": 2}]


def test_an_undeclared_topic_fails_the_step_without_retry(emitting: Emitting) -> None:
    h = emitting.harness
    run_id = h.submit("undeclared_emitter", "u")
    item = emitting.work(run_id)
    result = execute(item, h.app, "test-worker")
    assert [e.topic for e in result.emits] == ["nobody.declared.this"]
    h.produce_model(TopicName.RESULTS, run_id, result)
    assert emitting.ended(run_id) == "failed"
    (failed,) = [f for f in h.facts(run_id) if isinstance(f, SegmentFailed)]
    assert failed.error_type == UNDECLARED_TOPIC
    assert "'nobody.declared.this', which is not declared" in failed.error
    assert not [f for f in h.facts(run_id) if isinstance(f, EventEmitted)]
    assert len([i for i in h.work_items if i.run_id == run_id]) == 1  # not retried


def test_a_topic_the_settings_declare_is_open_to_every_pipeline(tmp_path: Path) -> None:
    """Embedded only: the settings reach the processor's check the same way on both."""
    from processor.config.settings import Settings
    from processor.worker.context import StepContext
    from processor.worker.pipeline import Application, Pipeline

    audit = Pipeline("audited")

    @audit.step()
    def note(value: object, ctx: StepContext) -> object:
        ctx.emit("audit.all", {"noted": value})
        return value

    settings = Settings(data_dir=tmp_path / "data", emit_topics="audit.all")
    harness = LoopHarness(settings.data_dir, Application([audit]), settings=settings)
    try:
        emitting = Emitting(harness, "audit.all")
        ensure_topics(harness.deployment, ["audit.all"])
        run_id = harness.submit("audited", 1)
        harness.complete(emitting.work(run_id))
        assert emitting.ended(run_id) == "succeeded"
        assert _values(emitting.events(run_id)) == [{"noted": 1}]
    finally:
        harness.close()
