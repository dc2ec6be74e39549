"""The three-broker cluster of ``compose/local-kafka cluster`` (a helper module and fixtures).

``KAFKA_CLUSTER_BOOTSTRAP_SERVERS`` names a cluster to use as it is (its brokers
cannot be killed by the tests that need to: those skip). Otherwise the launcher
starts its cluster (idempotent) and the tests may kill and restart its nodes; under
``CI=true`` a cluster that cannot start fails the tests instead of skipping them.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.apps.support import wait_until
from tests.kafka.support import KafkaSpace
from tests.kafka_broker import LOCAL_KAFKA, REPO_ROOT

_LAUNCHER_TIMEOUT_S = 900.0  # the first start may download the Kafka jars


class Cluster:
    """The launcher's cluster: where it listens, and its nodes to kill and restart."""

    def __init__(self, bootstrap: str, *, managed: bool) -> None:
        self.bootstrap = bootstrap
        self.managed = managed

    def launcher(self, *args: str) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(LOCAL_KAFKA), "cluster", *args],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=_LAUNCHER_TIMEOUT_S,
            check=False,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        return result

    def kill(self, node: int) -> None:
        """kill -9 one broker (node ids are the launcher's node numbers)."""
        self.launcher("kill", str(node))

    def start_node(self, node: int) -> None:
        self.launcher("start-node", str(node))
        self.wait_all_brokers()

    def wait_all_brokers(self, brokers: int = 3, timeout_s: float = 60.0) -> None:
        """Until the cluster's metadata lists ``brokers`` brokers: a node just started
        (or one not yet fenced after a kill) would make new topics get fewer replicas."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        wait_until(
            lambda: len(admin.list_topics(timeout=10).brokers) == brokers,
            timeout_s,
            f"the cluster to list {brokers} brokers",
            max_pause_s=0.5,
        )

    def wait_caught_up(self, timeout_s: float = 60.0) -> None:
        """Until each broker knows a topic created now: a node back from a kill may list
        itself before it has caught up with the cluster's metadata, and answer that the
        topics a test just created do not exist (CI once failed two tests so)."""
        probe = f"probe-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        admin.create_topics([NewTopic(probe, 1, 3)])[probe].result(timeout_s)
        try:
            for address in self.bootstrap.split(","):
                # A client of that broker alone: its first metadata request goes there.
                single = AdminClient({"bootstrap.servers": address})
                wait_until(
                    lambda single=single: _has_leader(single, probe),
                    timeout_s,
                    f"{address} to know a new topic",
                    max_pause_s=0.5,
                )
        finally:
            admin.delete_topics([probe])[probe].result(timeout_s)

    def leaders(self, topic: str) -> dict[int, int]:
        """Partition -> the node that leads it now (-1: none)."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        described = admin.list_topics(topic, timeout=10).topics[topic]
        return {p: meta.leader for p, meta in described.partitions.items()}


def _has_leader(admin: AdminClient, topic: str) -> bool:
    described = admin.list_topics(topic, timeout=10).topics.get(topic)
    return (
        described is not None
        and described.error is None
        and all(p.leader >= 0 for p in described.partitions.values())
    )


def start_cluster() -> Cluster:
    """Start the launcher's cluster (idempotent) and return it; RuntimeError if it fails."""
    started = subprocess.run(
        [str(LOCAL_KAFKA), "cluster", "start"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=_LAUNCHER_TIMEOUT_S,
        check=False,
    )
    if started.returncode != 0:
        raise RuntimeError(f"the three-broker cluster did not start: {started.stderr[-1500:]}")
    url = started.stdout.strip().splitlines()[-1]
    return Cluster(url.removeprefix("kafka://"), managed=True)


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    configured = os.environ.get("KAFKA_CLUSTER_BOOTSTRAP_SERVERS", "").strip()
    if configured:
        return Cluster(configured, managed=False)
    try:
        return start_cluster()
    except RuntimeError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(str(exc))
        pytest.skip(str(exc))


@pytest.fixture
def cluster_space(cluster: Cluster) -> Iterator[KafkaSpace]:
    """A private topic prefix and groups on the cluster; deleted afterwards."""
    cluster.wait_all_brokers()
    cluster.wait_caught_up()
    created = KafkaSpace.new(cluster.bootstrap)
    yield created
    created.delete_topics()
