"""A processor starts its work only once its in-process workers have joined their group.

A worker that joined later would take partitions away from one that already runs
their work items, and those would run again (issue 27). The workers' consumers here
say they have joined only when the test opens a gate: until then the processor runs
no round, however long the workers have been polling.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from processor.config.settings import Settings
from processor.engine.host import Host
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


def test_the_processor_runs_no_round_before_its_workers_have_joined(tmp_path: Path) -> None:
    deployment = Deployment.from_settings(Settings(data_dir=tmp_path / "data"))
    gate = threading.Event()
    transport = _GatedTransport(deployment.transport, gate)
    host = Host(replace(deployment, transport=transport), app, workers=2)  # type: ignore[arg-type]
    rounds: list[float] = []
    host.on_round = rounds.append
    starting = threading.Thread(target=host.start, daemon=True)
    starting.start()
    try:
        wait_until(
            lambda: (
                len(transport.consumers) == 2 and all(c.polls >= 3 for c in transport.consumers)
            ),
            30.0,
            "both workers to poll",
        )
        assert rounds == []  # the processor waits for them
        assert starting.is_alive()
        gate.set()
        wait_until(lambda: rounds, 30.0, "the processor's first round")
        starting.join(30)
    finally:
        gate.set()
        starting.join(30)
        host.stop()
    assert not host.errors, host.errors
