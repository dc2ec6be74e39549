"""On one broker: topics get what one broker can give, every producer writes with
``acks=all``, and ``processor run`` says at start which durability that is."""

from __future__ import annotations

from pathlib import Path

import pytest

from processor.facts.topics import TopicName
from processor.transport.deployment import journal_durability
from processor.transport.kafka import KafkaTransport
from tests.kafka.support import KafkaSpace

pytestmark = pytest.mark.kafka


def test_one_broker_caps_the_declared_replication(space: KafkaSpace, tmp_path: Path) -> None:
    deployment = space.deployment(tmp_path)
    assert deployment.topology.replication.factor == 3  # declared: the production default
    admin = deployment.transport.admin()
    try:
        journal = admin.describe_topics()[deployment.topology.name(TopicName.FACTS)]
    finally:
        admin.close()
    assert (journal.replication, journal.min_insync_replicas) == (1, 1)
    assert journal.config["min.insync.replicas"] == "1"  # set on the topic, not inherited
    assert journal_durability(deployment).mode == "kafka-single-copy"


def test_every_producer_waits_for_all_in_sync_replicas(space: KafkaSpace, tmp_path: Path) -> None:
    transport = space.deployment(tmp_path).transport
    assert isinstance(transport, KafkaTransport)
    producer = transport.producer()
    session = transport.session(space.group, "acks-check")
    try:
        for config in (producer.config, session.producer_config):
            assert config["acks"] == "all"
            assert config["enable.idempotence"] is True
        assert "transactional.id" in session.producer_config
    finally:
        producer.close()
        session.close()


@pytest.mark.slow
def test_processor_run_logs_its_durability(space: KafkaSpace, tmp_path: Path) -> None:
    processor = space.process(tmp_path / "processor", tmp_path / "processor.log", workers=0)
    try:
        processor.start()
        processor.wait_running()
        log = processor.log_text()
    finally:
        processor.close()
    assert "durability kafka-single-copy (replication 1, min.insync.replicas 1)" in log
