"""A control listener that cannot read says so once, and again once it reads again;
the workers of a process share one."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from processor.facts.topics import TopicName
from processor.transport.base import TopicPartition
from processor.transport.embedded import EmbeddedTransport
from processor.transport.topology import Topology
from processor.worker.control import ControlListener, SharedListeners


def test_a_read_failure_is_logged_once_until_reading_works_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    transport = EmbeddedTransport(tmp_path / "log", default_partitions=2)
    topology = Topology(partitions=2)
    listener = ControlListener(transport, topology, "w-1")
    reader = transport.reader()
    positions: dict[TopicPartition, int] = {}
    caplog.set_level(logging.WARNING, logger="processor.worker.control")
    try:
        for _ in range(3):  # segments.control does not exist yet
            listener._read_new(reader, positions)
        failures = [r for r in caplog.records if "cannot read segments.control" in r.getMessage()]
        assert len(failures) == 1
        admin = transport.admin()
        admin.create_topics(
            [s for s in topology.specs() if s.name == topology.name(TopicName.CONTROL)]
        )
        admin.close()
        listener._read_new(reader, positions)
        listener._read_new(reader, positions)
        again = [r for r in caplog.records if "reading segments.control again" in r.getMessage()]
        assert len(again) == 1
        assert len(positions) == 2  # both partitions are read from their ends
    finally:
        reader.close()


def _listener_threads() -> int:
    return sum(t.name == "control-listener" and t.is_alive() for t in threading.enumerate())


def test_the_workers_of_a_process_share_one_listener_while_any_runs(tmp_path: Path) -> None:
    listeners = SharedListeners()
    topology = Topology(partitions=2)
    transport = EmbeddedTransport(tmp_path / "log", default_partitions=2)
    other = EmbeddedTransport(tmp_path / "other", default_partitions=2)
    before = _listener_threads()
    first = listeners.join(transport, topology, "w0")
    second = listeners.join(transport, topology, "w1")
    elsewhere = listeners.join(other, topology, "w2")
    assert first is second
    assert elsewhere is not first
    assert _listener_threads() == before + 2  # one a transport, not one a worker
    listeners.leave(first)
    assert listeners.join(transport, topology, "w3") is first  # still running: shared
    listeners.leave(first)
    listeners.leave(second)
    listeners.leave(elsewhere)
    assert _listener_threads() == before  # the last to leave stopped each
    again = listeners.join(transport, topology, "w4")
    assert again is not first  # a new one, reading from the ends it has now
    listeners.leave(again)
