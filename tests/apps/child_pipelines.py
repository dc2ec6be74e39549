"""Pipelines that start child runs (``Pipeline.child``), for the child-run tests.

``processor run --app tests.apps.child_pipelines:app`` with
``TEST_CRASH_POINT=after_child_submit`` dies with ``os._exit(CRASH_EXIT)`` (kill -9 at
a chosen instant) at the first batch that submits a child run: the ``SubmitRun`` was
produced into the open transaction with the parent's dispatch facts (flushed to the
broker on Kafka), and the transaction was not committed.
"""

from __future__ import annotations

import os
from typing import Any

from processor.engine.loop import ProcessorLoop
from processor.facts.topics import TopicName
from processor.model.pipeline_spec import RetryPolicy
from processor.worker.pipeline import Application, NonRetryableError, Pipeline

__all__ = ["CRASH_EXIT", "app"]

CRASH_EXIT = 88
_POINT = os.environ.get("TEST_CRASH_POINT", "")
assert _POINT in ("", "after_child_submit"), f"unknown TEST_CRASH_POINT {_POINT!r}"

parent = Pipeline("parent")


@parent.child(
    "kid",
    timeout_s=60,
    retry=RetryPolicy(max_attempts=2, initial_backoff_ms=0),
    step_timeout_s=1.0,
)
def call_kid(value: Any) -> Any:
    return {"n": value}


@parent.step()
def after(value: Any) -> Any:
    return {"got": value}


kid = Pipeline("kid")


@kid.step()
def double(value: Any) -> Any:
    if value["n"] == "boom":
        raise NonRetryableError("the kid failed")
    return value["n"] * 2


many = Pipeline("many")


@many.child("kid", timeout_s=60, itemized=True, max_in_flight=2, tolerate=1)
def call_kids(value: Any) -> Any:
    return [{"n": n} for n in value]


waiting_parent = Pipeline("waiting_parent")


@waiting_parent.child("waiting_kid", timeout_s=600)
def call_waiting_kid(value: Any) -> Any:
    return value


waiting_kid = Pipeline("waiting_kid")


@waiting_kid.await_step(target="nobody.answers", timeout_s=600)
def wait_forever(value: Any) -> Any:
    return value


nest = Pipeline("nest")


@nest.child("nest", timeout_s=600)
def call_self(value: Any) -> Any:
    return value + 1


graph_parent = Pipeline("graph_parent")


@graph_parent.step(needs=[])
def start(value: Any) -> Any:
    return value


@graph_parent.child("kid", timeout_s=60, needs=["start"])
def call_kid_in_graph(value: Any) -> Any:
    return {"n": value}


@graph_parent.step(needs=["call_kid_in_graph"])
def finish(value: Any) -> Any:
    return {"graph_got": value}


graph_waiting_parent = Pipeline("graph_waiting_parent")


@graph_waiting_parent.step(needs=[])
def begin(value: Any) -> Any:
    return value


@graph_waiting_parent.child("waiting_kid", timeout_s=600, needs=["begin"])
def call_waiting_kid_in_graph(value: Any) -> Any:
    return value


failing_parent = Pipeline("failing_parent")


@failing_parent.child("boom_or_wait_kid", timeout_s=600, itemized=True)
def call_boom_and_waiting_kids(value: Any) -> Any:
    return ["boom", value]


boom_or_wait_kid = Pipeline("boom_or_wait_kid")


@boom_or_wait_kid.step()
def boom_or_pass(value: Any) -> Any:
    if value == "boom":
        raise NonRetryableError("the kid failed")
    return value


@boom_or_wait_kid.await_step(target="nobody.answers", timeout_s=600)
def then_wait_forever(value: Any) -> Any:
    return value


app = Application(
    [
        *(parent, kid, many, waiting_parent, waiting_kid, nest, graph_parent),
        *(graph_waiting_parent, failing_parent, boom_or_wait_kid),
    ]
)


def _install() -> None:
    produce = ProcessorLoop._produce

    def crashing_produce(loop: ProcessorLoop, session: Any, batch: Any) -> None:
        produce(loop, session, batch)
        commands = loop._topology.name(TopicName.COMMANDS)
        if any(r.topic == commands and b"child/" in r.value for r in batch.outbound):
            producer = getattr(session, "_producer", None)  # Kafka: reach the broker
            if producer is not None:
                producer.flush(30)
            os._exit(CRASH_EXIT)

    ProcessorLoop._produce = crashing_produce  # type: ignore[method-assign,assignment]


if _POINT:
    _install()
