"""A publishing pipeline, with a crash point around terminal publication (tests only).

``publisher`` publishes its result to ``TEST_PUBLISHED_TOPIC`` (default
``test.published``; a test on a shared broker names its own).
``processor run --app tests.apps.publication_crash:app`` with ``TEST_CRASH_POINT`` set
dies with ``os._exit(CRASH_EXIT)`` (no handler, no flush, no cleanup: kill -9 at a
chosen instant) at the first batch that produces a terminal publication:

- ``after_publish``: the publication was produced into the open transaction with
  its ``TerminalPublicationCompleted`` (flushed to the broker on Kafka), and the
  transaction was not committed (before the loop's step 2);
- ``before_apply``: the transaction with ``TerminalPublicationCompleted`` and
  ``RunSucceeded`` is committed, RocksDB has not applied it (before step 3);
- ``after_apply``: the batch is committed and applied (after step 3).

``pause_before_publish`` instead stops the process (SIGSTOP to itself, heartbeats
and all) once it has decided a publication and before it produces it: a test
resumes it with SIGCONT after another instance took its partitions over (a zombie).

The hook lives here, not in ``processor/``: only a process started with this test app
can trip it, so production has no crash point to set by mistake.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from processor.engine.loop import ProcessorLoop
from processor.model.pipeline_spec import RetryPolicy
from processor.worker.pipeline import Application, Pipeline

__all__ = ["CRASH_EXIT", "CRASH_POINTS", "PAUSE_POINT", "app", "published_topic"]

CRASH_EXIT = 86
CRASH_POINTS = ("after_publish", "before_apply", "after_apply")
PAUSE_POINT = "pause_before_publish"
_POINT = os.environ.get("TEST_CRASH_POINT", "")
assert _POINT in ("", PAUSE_POINT, *CRASH_POINTS), f"unknown TEST_CRASH_POINT {_POINT!r}"


def published_topic() -> str:
    """Where ``publisher`` publishes, in this process."""
    return os.environ.get("TEST_PUBLISHED_TOPIC", "test.published")


publisher = Pipeline("publisher", output_topic=published_topic())


@publisher.step(retry=RetryPolicy(max_attempts=1))
def produce_result(value: Any) -> dict[str, Any]:
    return {"published": value}


app = Application([publisher])


def _die(point: str) -> None:
    if point == _POINT:
        os._exit(CRASH_EXIT)


def _install() -> None:
    produce, flush = ProcessorLoop._produce, ProcessorLoop._flush
    published: list[bool] = []  # set once a batch produced a publication

    def crashing_produce(loop: ProcessorLoop, session: Any, batch: Any) -> None:
        if batch.effects and _POINT == PAUSE_POINT and not published:
            os.kill(os.getpid(), signal.SIGSTOP)
        produce(loop, session, batch)
        if batch.effects:
            published.append(True)
            producer = getattr(session, "_producer", None)  # Kafka: reach the broker
            if _POINT == "after_publish" and producer is not None:
                producer.flush(30)
            _die("after_publish")

    def crashing_flush(loop: ProcessorLoop, produced: list[Any]) -> dict[int, int]:
        if published:
            _die("before_apply")
        ends = flush(loop, produced)
        if published:
            _die("after_apply")
        return ends

    ProcessorLoop._produce = crashing_produce  # type: ignore[method-assign,assignment]
    ProcessorLoop._flush = crashing_flush  # type: ignore[method-assign,assignment]


if _POINT:
    _install()
