"""In-process workers take work only once all of them have joined their group.

A worker that joined later would take partitions away from one that already runs
their work items, and those would run again (issue 27). The workers' consumers here
say they have joined only when the test opens a gate: until then the processor
dispatches a run, and no worker takes it, however long they have been polling.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from processor.clients.client import Client
from processor.config.settings import Settings
from processor.engine.host import Host
from processor.facts.models import SegmentAttemptStarted
from processor.transport.base import GroupConsumer, Record, TopicPartition, Transport
from processor.transport.deployment import Deployment
from tests.apps.pipelines import app
from tests.apps.support import wait_until


class _GatedConsumer:
    """A group consumer that has joined only once ``gate`` is open; counts its polls."""

    def __init__(self, inner: GroupConsumer, gate: threading.Event) -> None:
        self._inner = inner
        self._gate = gate
        self.polls = 0

    def poll(self, max_records: int, timeout_s: float) -> list[Record]:
        self.polls += 1
        return self._inner.poll(max_records, timeout_s)

    def joined(self) -> bool:
        return self._gate.is_set() and self._inner.joined()

    def hold(self, held: bool) -> None:
        self._inner.hold(held)

    def commit(self, consumed: Mapping[TopicPartition, int]) -> None:
        self._inner.commit(consumed)

    def commit_soon(self, consumed: Mapping[TopicPartition, int]) -> None:
        self._inner.commit_soon(consumed)

    def close(self) -> None:
        self._inner.close()


class _GatedTransport:
    """``inner``, whose group consumers (the workers') are gated."""

    def __init__(self, inner: Transport, gate: threading.Event) -> None:
        self._inner = inner
        self._gate = gate
        self.consumers: list[_GatedConsumer] = []

    def consumer(
        self, group: str, topics: Sequence[str], instance_id: str | None = None
    ) -> _GatedConsumer:
        made = _GatedConsumer(self._inner.consumer(group, topics, instance_id), self._gate)
        self.consumers.append(made)
        return made

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_no_worker_takes_work_before_all_of_the_processors_workers_have_joined(
    tmp_path: Path,
) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    deployment = Deployment.from_settings(settings)
    gate = threading.Event()
    transport = _GatedTransport(deployment.transport, gate)
    host = Host(replace(deployment, transport=transport), app, workers=2)  # type: ignore[arg-type]
    host.start()
    try:
        with Client(settings=settings) as client:
            # One long step: however long the gate stays shut on a loaded machine, the
            # attempt is not lost and retried meanwhile (steps3's would be after 6 s).
            receipt = client.submit("patient", {"n": 1}, wait_s=30)
            assert receipt.run_id is not None
            wait_until(
                lambda: any(
                    isinstance(f, SegmentAttemptStarted) for f in client.history(receipt.run_id)
                ),
                30.0,
                "the processor to dispatch the run",
            )
            polling = transport.consumers
            polled = [c.polls for c in polling]
            wait_until(
                lambda: all(c.polls >= n + 3 for c, n in zip(polling, polled, strict=True)),
                30.0,
                "both workers to poll again",
            )
            state = client.status(receipt.run_id)
            assert state is not None and (state.status, state.phase) == ("running", "dispatched")
            assert not host.workers_ready(0)
            gate.set()
            assert host.workers_ready(30)
            assert client.wait(receipt.run_id, timeout_s=30).status == "succeeded"
    finally:
        gate.set()
        host.stop()
    assert not host.errors, host.errors
