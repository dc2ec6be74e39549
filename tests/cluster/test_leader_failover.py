"""kill -9 the broker that leads the journal, mid-workload, on the three-broker cluster.

The processor, its workers and this test's client keep going once the other two
brokers elect new leaders: every run ends exactly once (no lost and no duplicated
fact, one outcome each), ``replay --verify`` passes, and the same processor process
did all the work. The time from the kill until the journal grows again is printed.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from processor.clients.client import Client
from processor.config.settings import default_of
from processor.errors import TransportError
from processor.facts.topics import TopicName
from tests.apps.support import wait_until
from tests.cluster.conftest import Cluster
from tests.kafka.support import (
    FactsWatch,
    KafkaSpace,
    assert_replay_verifies,
    assert_steps3_once,
    submit_steps3,
    wait_all_ended,
)

pytestmark = [pytest.mark.kafka, pytest.mark.cluster, pytest.mark.slow]

RUNS = 2_000
#: Facts committed after the kill that show the processor is past it.
GROWTH = 100


def test_processor_survives_the_loss_of_the_journal_leader(
    cluster: Cluster,
    cluster_space: KafkaSpace,
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    if not cluster.managed:
        pytest.skip("the cluster in use is not compose/local-kafka's: its brokers are not ours")
    space = dataclasses.replace(
        cluster_space, transaction_timeout_ms=default_of("kafka_transaction_timeout_ms")
    )
    processor = space.process(tmp_path / "processor", tmp_path / "processor.log")
    deployment = space.deployment(tmp_path / "client")
    topology = deployment.topology
    client = Client(deployment.transport, topology, deployment.settings.state_dir)
    reader = deployment.transport.reader()
    watch = FactsWatch(reader, topology)
    inputs: dict[str, int] = {}
    submit_steps3(client, inputs, RUNS)
    killed: int | None = None

    def committed() -> int:
        try:
            return watch.committed()
        except TransportError:  # this test's own reader, while leaders move
            return -1

    try:
        processor.start()
        wait_until(lambda: committed() >= 1_000, 90, "progress", max_pause_s=0.01)
        leaders = cluster.leaders(topology.name(TopicName.FACTS))
        killed = max(set(leaders.values()), key=list(leaders.values()).count)
        at_kill = committed()
        cluster.kill(killed)
        started = time.monotonic()
        wait_until(
            lambda: committed() >= at_kill + GROWTH,
            180,
            f"the journal to grow from {at_kill} facts again",
            max_pause_s=0.05,
        )
        recovered_s = time.monotonic() - started
        processor.check_alive()
        led = sum(1 for leader in leaders.values() if leader == killed)
        print(
            f"killed node {killed} (leader of {led} journal partitions): "
            f"the journal grew by {GROWTH} facts {recovered_s:.1f} s later"
        )
        record_property("recovery_s", round(recovered_s, 1))
        assert killed not in cluster.leaders(topology.name(TopicName.FACTS)).values()

        wait_all_ended(watch, inputs, processor, 240)
        assert processor.starts == 1
        assert processor.stop() == 0, processor.log_text()[-3000:]
    finally:
        client.close()
        processor.close()
        if killed is not None:
            cluster.start_node(killed)

    assert_steps3_once(reader, topology, inputs)
    report = assert_replay_verifies(space, processor.data_dir)
    assert report["runs"] == len(inputs)
