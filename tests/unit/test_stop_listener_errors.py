"""A stop listener that cannot read says so once, and again once it reads again."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from processor.facts.topics import TopicName
from processor.transport.base import TopicPartition
from processor.transport.embedded import EmbeddedTransport
from processor.transport.topology import Topology
from processor.worker.stops import StopListener


def test_a_read_failure_is_logged_once_until_reading_works_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    transport = EmbeddedTransport(tmp_path / "log", default_partitions=2)
    topology = Topology(partitions=2)
    listener = StopListener(transport, topology, "w-1")
    reader = transport.reader()
    positions: dict[TopicPartition, int] = {}
    caplog.set_level(logging.WARNING, logger="processor.worker.stops")
    try:
        for _ in range(3):  # segments.control does not exist yet
            listener._read_new(reader, positions)
        failures = [r for r in caplog.records if "cannot read stop notices" in r.getMessage()]
        assert len(failures) == 1
        admin = transport.admin()
        admin.create_topics(
            [s for s in topology.specs() if s.name == topology.name(TopicName.CONTROL)]
        )
        admin.close()
        listener._read_new(reader, positions)
        listener._read_new(reader, positions)
        again = [r for r in caplog.records if "reading stop notices again" in r.getMessage()]
        assert len(again) == 1
        assert len(positions) == 2  # both partitions are read from their ends
    finally:
        reader.close()
