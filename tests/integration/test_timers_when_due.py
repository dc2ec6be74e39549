"""A timer fires when it is due, not at the next periodic scan of the due rows.

The processor scans its due rows every ``timer_interval_ms`` and also, when a commit
wrote a timer, at that timer's due time: a retry's backoff or a sleep of a few
milliseconds ends a few milliseconds later, not up to one scan period later. Here the
periodic scan is a minute apart, so only the due-time scan can end these waits within
the test's deadlines (on the wall clock: a real processor loop and worker).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from processor.clients.client import Client
from processor.config.settings import Settings
from processor.engine.host import Host
from processor.facts.models import RetryScheduled, SegmentAttemptStarted, SleepCompleted
from processor.model.pipeline_spec import RetryPolicy
from processor.transport.deployment import Deployment
from processor.worker.pipeline import Application, Pipeline

#: Far beyond every wait below: a timer fired at the periodic scan would fail the test.
SCAN_INTERVAL_MS = 60_000
#: How late (ms, by the processor's clock) a timer may fire on a loaded machine.
LATE_MS = 5_000

prompt = Pipeline("prompt_timers")
_tried: set[str] = set()


@prompt.step(retry=RetryPolicy(max_attempts=3, initial_backoff_ms=50))
def flaky(order: dict[str, Any]) -> dict[str, Any]:
    if order["id"] not in _tried:  # the first attempt of each run fails
        _tried.add(order["id"])
        raise RuntimeError("first attempt fails")
    return order


prompt.sleep(0.2, name="pause")


@prompt.step()
def done(order: dict[str, Any]) -> dict[str, Any]:
    return {"done": order["id"]}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[Client]:
    settings = Settings(
        broker=None, data_dir=tmp_path, partitions=1, timer_interval_ms=SCAN_INTERVAL_MS
    )
    deployment = Deployment.from_settings(settings)
    host = Host(deployment, Application([prompt]), workers=1)
    host.start()
    client = Client(deployment.transport, deployment.topology, settings.state_dir)
    try:
        yield client
    finally:
        client.close()
        host.stop()
    assert not host.errors, host.errors


def test_a_retry_backoff_and_a_sleep_end_when_due_not_at_the_next_scan(client: Client) -> None:
    receipt = client.submit("prompt_timers", {"id": "o-1"}, wait_s=20)
    result = client.wait(receipt.run_id, 20)
    assert result.status == "succeeded", result
    history = client.history(receipt.run_id)
    (retry,) = [f for f in history if isinstance(f, RetryScheduled)]
    again = [f for f in history if isinstance(f, SegmentAttemptStarted) and f.seq > retry.seq]
    assert again and again[0].time_ms - retry.due_ms < LATE_MS
    (woke,) = [f for f in history if isinstance(f, SleepCompleted)]
    assert woke.time_ms - woke.wake_ms < LATE_MS
