"""Pipelines that emit events (``ctx.emit``), with a crash point around their publication.

Events go to ``TEST_EMIT_TOPIC`` (default ``test.emitted``; a test on a shared broker
names its own). ``processor run --app tests.apps.emission_pipelines:app`` with
``TEST_CRASH_POINT=after_publish`` dies with ``os._exit(CRASH_EXIT)`` (kill -9 at a
chosen instant) at the first batch that publishes an emitted event: the events were
produced into the open transaction with their ``EventEmitted`` facts (flushed to the
broker on Kafka) and the transaction was not committed.

The hook lives here, not in ``processor/``: only a process started with this test app
can trip it.
"""

from __future__ import annotations

import os
from typing import Any

from processor.engine.loop import ProcessorLoop
from processor.model.pipeline_spec import RetryPolicy
from processor.worker.context import StepContext
from processor.worker.pipeline import Application, Pipeline

__all__ = ["CRASH_EXIT", "FAILED_ONCE", "app", "build_app", "emit_topic"]

CRASH_EXIT = 87
_POINT = os.environ.get("TEST_CRASH_POINT", "")
assert _POINT in ("", "after_publish"), f"unknown TEST_CRASH_POINT {_POINT!r}"


def emit_topic() -> str:
    """Where the pipelines emit, in this process."""
    return os.environ.get("TEST_EMIT_TOPIC", "test.emitted")


#: Runs whose ``flaky_emitter`` step has failed once (this process).
FAILED_ONCE: set[str] = set()


def build_app(topic: str) -> Application:
    """The emitting pipelines, emitting to ``topic``."""
    emitter = Pipeline("emitter", emits=[topic])

    @emitter.step(retry=RetryPolicy(max_attempts=1))
    def announce(value: Any, ctx: StepContext) -> Any:
        ctx.emit(topic, {"announced": value})
        ctx.emit(topic, {"again": value}, key="order-7")
        return value

    @emitter.step(retry=RetryPolicy(max_attempts=1))
    def finish(value: Any, ctx: StepContext) -> Any:
        ctx.emit(topic, {"finished": value})
        return {"done": value}

    flaky = Pipeline("flaky_emitter", emits=[topic])

    @flaky.step(retry=RetryPolicy(max_attempts=2, initial_backoff_ms=0))
    def emit_then_fail_once(value: Any, ctx: StepContext) -> Any:
        ctx.emit(topic, {"attempt": ctx.attempt})
        if ctx.run_id not in FAILED_ONCE:
            FAILED_ONCE.add(ctx.run_id)
            raise RuntimeError("first attempt fails after emitting")
        return value

    slow = Pipeline("slow_emitter", emits=[topic])

    @slow.step(retry=RetryPolicy(max_attempts=2, initial_backoff_ms=0), timeout_s=1.0)
    def emit_slowly(value: Any, ctx: StepContext) -> Any:
        ctx.emit(topic, {"slow": value})
        return value

    undeclared = Pipeline("undeclared_emitter")

    @undeclared.step(retry=RetryPolicy(max_attempts=3))
    def emit_elsewhere(value: Any, ctx: StepContext) -> Any:
        ctx.emit("nobody.declared.this", value)
        return value

    return Application([emitter, flaky, slow, undeclared])


app = build_app(emit_topic())


def _install() -> None:
    produce = ProcessorLoop._produce

    def crashing_produce(loop: ProcessorLoop, session: Any, batch: Any) -> None:
        produce(loop, session, batch)
        if any(effect.topic == emit_topic() for effect in batch.effects):
            producer = getattr(session, "_producer", None)  # Kafka: reach the broker
            if producer is not None:
                producer.flush(30)
            os._exit(CRASH_EXIT)

    ProcessorLoop._produce = crashing_produce  # type: ignore[method-assign,assignment]


if _POINT:
    _install()
