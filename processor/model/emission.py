"""Emission: events a step publishes to a declared topic, exactly once with its commit.

A step calls ``ctx.emit(topic, value, key=...)``; the worker carries the events of
the steps that returned in the attempt's result (``SegmentResult.emits``). When the
processor accepts that result (a stale one is refused before this module is asked),
each event becomes an ``EventEmitted`` fact and a ``Publish`` effect that the loop
produces in the same transaction as the fact: Kafka's EOS transaction, or the
embedded log's atomic commit. A redo after a crash decides the same result again
and publishes under the same event id; an aborted copy is never read by a
read_committed consumer.

The event id is derived from the run, the segment, the step and the event's index
among the step's emissions: it does not depend on the attempt, so consumers can
dedupe by it (the ``event-id`` header). Publication is not delivery: a consumer
that reads uncommitted records, or reprocesses, may see an id twice.

A topic must be declared, by the pipeline (``Pipeline(..., emits=[...])``) or by the
settings (``PROCESSOR_EMIT_TOPICS``); an event to another topic fails its step, not
retried (``UndeclaredTopic``): the step would emit there again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from processor.facts.models import Emission, EventEmitted, SegmentResult
from processor.model.decision import FactMaker, Publish
from processor.model.pipeline_spec import PipelineSpec
from processor.model.state import RunState

__all__ = [
    "UNDECLARED_TOPIC",
    "checked",
    "emitted_key",
    "event_id",
    "published_emissions",
    "record",
]

#: The error type of a step that emitted to a topic nobody declared.
UNDECLARED_TOPIC = "UndeclaredTopic"


def event_id(run_id: str, segment: int, step: int, index: int) -> str:
    """The id of event ``index`` of ``step`` in ``segment`` of a run: 32 hex digits,
    the same in every attempt of the segment."""
    text = f"emit|{len(run_id)}:{run_id}|{segment}|{step}|{index}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def emitted_key(segment: int, step: int, index: int) -> str:
    """The fact key of an ``EventEmitted`` (engine integers only)."""
    return f"segment/{segment}/step/{step}/emitted/{index}"


def declared_topics(spec: PipelineSpec, settings_topics: Iterable[str]) -> frozenset[str]:
    """The topics a step of ``spec`` may emit to."""
    return frozenset(spec.emit_topics) | frozenset(settings_topics)


def checked(
    spec: PipelineSpec, state: RunState, result: SegmentResult, settings_topics: Iterable[str]
) -> SegmentResult:
    """``result``, or its failure at the first step that emitted to an undeclared topic."""
    declared = declared_topics(spec, settings_topics)
    ran = _ran_steps(spec, state, result)
    bad = next((e for e in result.emits if e.step in ran and e.topic not in declared), None)
    if bad is None:
        return result
    name = spec.steps[bad.step].name
    error = (
        f"step {name!r} emits to topic {bad.topic!r}, which is not declared: declare it "
        f"with Pipeline(..., emits=[{bad.topic!r}]) or in PROCESSOR_EMIT_TOPICS"
    )
    return result.model_copy(
        update={
            "outcome": "failed",
            "steps": tuple(s for s in result.steps if s.step < bad.step),
            "emits": tuple(e for e in result.emits if e.step < bad.step),
            "failed_step": bad.step,
            "error": error,
            "error_type": UNDECLARED_TOPIC,
            "retryable": False,
            "requests": (),
        }
    )


def published_emissions(
    spec: PipelineSpec, state: RunState, result: SegmentResult
) -> list[tuple[int, Emission]]:
    """The events of ``result`` that are published, each with its index in its step:
    those of steps that returned (a failed step's are dropped; it runs again)."""
    ran = _ran_steps(spec, state, result)
    counts: dict[int, int] = {}
    out: list[tuple[int, Emission]] = []
    for emission in result.emits:
        if emission.step not in ran:
            continue
        index = counts.get(emission.step, 0)
        counts[emission.step] = index + 1
        out.append((index, emission))
    return out


def record(maker: FactMaker, spec: PipelineSpec, state: RunState, result: SegmentResult) -> None:
    """Record each published event of an accepted ``result`` and publish it with the facts."""
    run_id = maker.run_id
    for index, emission in published_emissions(spec, state, result):
        eid = event_id(run_id, result.segment, emission.step, index)
        key = emission.key if emission.key is not None else run_id
        maker.add(
            EventEmitted(
                **maker.header(emitted_key(result.segment, emission.step, index)),
                segment=result.segment,
                step=emission.step,
                index=index,
                event_id=eid,
                topic=emission.topic,
                key=key,
                value=emission.value,
            )
        )
        maker.effects.append(Publish(emission.topic, key, emission.value, _headers(eid, run_id)))


def _headers(eid: str, run_id: str) -> tuple[tuple[str, bytes], ...]:
    return (
        ("event-id", eid.encode()),
        ("idempotency-key", eid.encode()),
        ("run-id", run_id.encode()),
        ("content-type", b"application/json"),
    )


def _ran_steps(spec: PipelineSpec, state: RunState, result: SegmentResult) -> frozenset[int]:
    """The steps of ``result`` that returned: its recorded steps, and the await or sleep
    step it suspended at."""
    ran = {s.step for s in result.steps}
    if result.outcome == "suspended":
        ran.add(spec.segment_end(state.attempt.next_step))
    return frozenset(ran)
