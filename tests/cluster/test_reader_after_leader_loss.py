"""A reader asks for a partition's end after its leader died: it finds the new leader.

librdkafka does not refresh the metadata of a partition that a consumer only queries
(never assigned), so without a refresh every watermark query of that partition
failed (timed out, then "unknown partition") until the old leader came back: a
processor that rebuilt its session after the kill could not restore, for minutes.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from processor.facts.topics import TopicName
from processor.transport.base import TopicPartition
from processor.transport.fact_batches import FactBatchReader
from processor.transport.kafka_reader import KafkaReader
from tests.cluster.conftest import Cluster
from tests.kafka.support import KafkaSpace

pytestmark = [pytest.mark.kafka, pytest.mark.cluster, pytest.mark.slow]


def test_watermarks_follow_a_new_leader(
    cluster: Cluster, cluster_space: KafkaSpace, tmp_path: Path
) -> None:
    if not cluster.managed:
        pytest.skip("the cluster in use is not compose/local-kafka's: its brokers are not ours")
    deployment = cluster_space.deployment(tmp_path)
    topic = deployment.topology.name(TopicName.FACTS)
    reader = deployment.transport.reader()
    # The Kafka reader, behind the journal's expansion of fact batches.
    assert isinstance(reader, FactBatchReader) and isinstance(reader.inner, KafkaReader)
    tp = TopicPartition(topic, 1)
    assert reader.end_offset(tp) == 0
    assert reader.wait_stable(tp, 5.0)  # makes its read_uncommitted consumer too
    leader = cluster.leaders(topic)[1]
    cluster.kill(leader)
    try:
        started = time.monotonic()
        deadline = started + 60
        answered = None
        while answered is None and time.monotonic() < deadline:
            try:
                answered = (reader.end_offset(tp), reader.wait_stable(tp, 5.0))
            except Exception:  # the election is still under way: ask again
                time.sleep(0.5)
        assert answered == (0, True), "the reader never found the partition's new leader"
        print(f"the reader found the new leader {time.monotonic() - started:.1f} s after the kill")
        assert cluster.leaders(topic)[1] != leader
    finally:
        reader.close()
        cluster.start_node(leader)
