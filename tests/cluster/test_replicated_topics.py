"""On three brokers: topics get the production replication, and the processor says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from processor.facts.topics import TopicName
from processor.transport.deployment import journal_durability
from tests.cluster.conftest import Cluster
from tests.kafka.support import KafkaSpace

pytestmark = [pytest.mark.kafka, pytest.mark.cluster]


def test_topics_are_replicated_three_times_with_two_in_sync(
    cluster: Cluster, cluster_space: KafkaSpace, tmp_path: Path
) -> None:
    deployment = cluster_space.deployment(tmp_path)
    admin = deployment.transport.admin()
    try:
        topics = admin.describe_topics()
    finally:
        admin.close()
    ours = {name: spec for name, spec in topics.items() if name.startswith(cluster_space.prefix)}
    assert len(ours) >= len(deployment.topology.declarations)
    for name, spec in ours.items():
        assert (spec.replication, spec.min_insync_replicas) == (3, 2), name
    journal = deployment.topology.name(TopicName.FACTS)
    assert set(cluster.leaders(journal).values()) <= {1, 2, 3}
    found = journal_durability(deployment)
    assert found.mode == "kafka-replicated"
    assert "the loss of 1 broker" in found.survives
