"""The Kafka broker restarts under a running processor: it waits, resumes, loses nothing.

``compose/local-kafka restart`` stops the broker (SIGTERM, clean shutdown) and
starts it again while runs are in flight. The broker is shared with other tests
and developers: it is restarted only inside this test, which makes sure it is
running again when it ends, whatever happened. Skipped unless the broker in use
is the one ``compose/local-kafka`` manages (CI must have it: there it fails).

The outage can make librdkafka block in ``send_offsets_to_transaction`` past its
timeout when the group coordinator goes away during the call
(confluentinc/librdkafka#5456, #5511). The processor's watchdog abandons such a
commit and the loop rebuilds its session, so the same process, never restarted,
must finish every run exactly once. How often the watchdog fired is reported.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition

from processor.clients.client import Client
from processor.config.settings import default_of
from tests.apps.support import wait_until
from tests.kafka.support import (
    FactsWatch,
    KafkaSpace,
    assert_replay_verifies,
    assert_steps3_once,
    submit_steps3,
    wait_all_ended,
)
from tests.kafka_broker import LOCAL_BOOTSTRAP, LOCAL_KAFKA, REPO_ROOT

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.exclusive]

RUNS = 1_500
_LAUNCHER_TIMEOUT_S = 180.0
#: What the processor logs when its watchdog abandons a hung transactional call.
HUNG_COMMIT = "did not return within"


def local_kafka(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LOCAL_KAFKA), command],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=_LAUNCHER_TIMEOUT_S,
        check=False,
    )


@pytest.fixture
def restartable_broker(space: KafkaSpace) -> Iterator[None]:
    """The broker is compose/local-kafka's; it is running again after the test."""
    if space.bootstrap != LOCAL_BOOTSTRAP or local_kafka("status").returncode != 0:
        reason = "the broker in use is not managed by compose/local-kafka"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}: CI must run every Kafka test")
        pytest.skip(reason)
    try:
        yield
    finally:
        started = local_kafka("start")  # reuses a running broker
        assert started.returncode == 0, started.stderr[-2000:]
        _wait_coordinators_loaded(space.bootstrap, f"{space.prefix}runs.commands")


def _wait_coordinators_loaded(bootstrap: str, topic: str, timeout_s: float = 120.0) -> None:
    """Until a transaction can be begun and committed with a group's offsets: after a
    restart the broker loads its transaction and group logs first (COORDINATOR_LOAD_
    IN_PROGRESS), and the next test on it must not start against that."""
    name = f"ready-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": name})
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": name})
    try:
        producer.init_transactions(timeout_s)
        producer.begin_transaction()
        offsets = [KafkaTopicPartition(topic, 0, 0)]
        producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), timeout_s)
        producer.commit_transaction(timeout_s)
    finally:
        consumer.close()


def test_processor_survives_a_broker_restart(
    space: KafkaSpace,
    restartable_broker: None,
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    # The production transaction timeout: a restart takes the broker away for longer
    # than the short one the other tests use, and the transaction open at that moment
    # should be able to commit when the broker is back.
    space = dataclasses.replace(
        space, transaction_timeout_ms=default_of("kafka_transaction_timeout_ms")
    )
    processor = space.process(tmp_path / "processor", tmp_path / "processor.log")
    deployment = space.deployment(tmp_path / "client")
    topology = deployment.topology
    client = Client(deployment.transport, topology, deployment.settings.state_dir)
    reader = deployment.transport.reader()
    watch = FactsWatch(reader, topology)
    inputs: dict[str, int] = {}
    submit_steps3(client, inputs, RUNS)

    try:
        processor.start()
        target = watch.committed() + 3_000  # about a fifth of the work
        wait_until(lambda: watch.committed() >= target, 60, "progress", max_pause_s=0.01)
        in_flight = len(inputs) - len(watch.refresh())
        assert in_flight > 0

        restarted = local_kafka("restart")
        assert restarted.returncode == 0, restarted.stderr[-2000:]
        processor.check_alive()  # it waited for the broker instead of giving up

        wait_all_ended(watch, inputs, processor, 240)
        log = processor.log_text()
        assert "Kafka unreachable" in log  # it noticed the outage
        assert processor.starts == 1  # the same process did all the work
        assert processor.stop() == 0, log[-3000:]
        hung_commits = log.count(HUNG_COMMIT)
        record_property("hung_commits_abandoned", hung_commits)
        print(f"watchdog: {hung_commits} hung transactional call(s) abandoned")
    finally:
        client.close()
        processor.close()

    assert_steps3_once(reader, topology, inputs)
    report = assert_replay_verifies(space, processor.data_dir)
    assert report["runs"] == len(inputs)
