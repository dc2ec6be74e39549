"""A group member with a short session timeout keeps its partitions while it is idle.

librdkafka heartbeats every 3 s unless told otherwise; a member whose session is
shorter than that is evicted between two heartbeats, rejoins, and loses its
partitions again and again. The transport heartbeats three times a session.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from processor.config.settings import Settings
from processor.transport.base import TopicPartition, TopicSpec
from processor.transport.kafka import KafkaTransport
from tests.kafka_broker import kafka_bootstrap, unavailable_reason

pytestmark = pytest.mark.kafka

#: Shorter than librdkafka's default heartbeat interval (3 s); compose/local-kafka lets
#: sessions be this short.
SESSION_TIMEOUT_MS = 2_000
IDLE_S = 10.0


@pytest.fixture
def transport_and_topic(tmp_path: Path) -> Iterator[tuple[KafkaTransport, str]]:
    bootstrap = kafka_bootstrap()
    if bootstrap is None:
        pytest.skip(unavailable_reason())
    settings = Settings(broker=f"kafka://{bootstrap}", data_dir=tmp_path)
    transport = KafkaTransport(settings, session_timeout_ms=SESSION_TIMEOUT_MS)
    topic = f"heartbeats.{uuid.uuid4().hex[:12]}"
    admin = transport.admin()
    try:
        admin.create_topics([TopicSpec(topic, 1)])
    finally:
        admin.close()
    yield transport, topic
    deleting = AdminClient({"bootstrap.servers": bootstrap})
    for future in deleting.delete_topics([topic]).values():
        future.result()


def test_a_member_with_a_short_session_keeps_its_partition_while_idle(
    transport_and_topic: tuple[KafkaTransport, str],
) -> None:
    transport, topic = transport_and_topic
    assigned: list[list[int]] = []
    revoked: list[list[int]] = []

    def on_assign(partitions: Sequence[TopicPartition]) -> None:
        assigned.append([p.partition for p in partitions])

    def on_revoke(partitions: Sequence[TopicPartition]) -> None:
        revoked.append([p.partition for p in partitions])

    session = transport.session(f"heartbeats-{uuid.uuid4().hex[:12]}", "p1")
    try:
        session.subscribe([topic], on_assign, on_revoke)
        deadline = time.monotonic() + 30
        while not assigned:
            assert time.monotonic() < deadline, "never assigned"
            session.poll(10, 0.2)
        idle_until = time.monotonic() + IDLE_S  # five sessions with nothing to read
        while time.monotonic() < idle_until:
            assert session.poll(10, 0.2) == []
        assert (assigned, revoked) == ([[0]], [])  # before close, which revokes
    finally:
        session.close()
