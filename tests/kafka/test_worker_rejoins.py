"""A worker whose consumer the group fenced joins again and takes work.

A broker outage can end a static member's session while its next join is already on
its way: the coordinator gives the member's ``group.instance.id`` to the new join and
fences the old consumer, which librdkafka makes fatal. The workers of ``processor
run`` are static members; one left with a dead consumer polls nothing, forever, and
every run waiting for a step stalls (CI saw it after a broker restart). Here a twin
with the worker's identity fences its consumer on purpose.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from processor.config.settings import Settings
from processor.facts.topics import TopicName
from processor.transport.base import TopicSpec
from processor.transport.kafka import KafkaTransport
from processor.transport.topology import Topology
from tests.conformance.test_worker_runtime import WAIT_S, Space, outputs, work
from tests.kafka_broker import kafka_bootstrap, unavailable_reason

pytestmark = pytest.mark.kafka


@pytest.fixture
def space(tmp_path: Path) -> Iterator[Space]:
    bootstrap = kafka_bootstrap()
    if bootstrap is None:
        pytest.skip(unavailable_reason())
    settings = Settings(broker=f"kafka://{bootstrap}", data_dir=tmp_path / "data")
    transport = KafkaTransport(settings, session_timeout_ms=6_000, max_poll_interval_ms=30_000)
    topology = Topology(prefix=f"wrj.{uuid.uuid4().hex[:10]}.", partitions=1)
    wanted = {TopicName.WORK, TopicName.CONTROL, TopicName.RESULTS, TopicName.REJECTED}
    admin = transport.admin()
    try:
        admin.create_topics(
            [
                TopicSpec(topology.name(d.name), 1, dict(d.config))
                for d in topology.declarations
                if d.name in wanted
            ]
        )
    finally:
        admin.close()
    made = Space(transport, topology, f"workers-{uuid.uuid4().hex[:8]}")
    yield made
    for worker, _, _ in list(made.workers):
        made.stop_worker(worker)


def test_a_worker_fenced_by_its_twin_joins_again_and_runs_work(space: Space) -> None:
    worker = space.start_worker(worker_id=f"w-{uuid.uuid4().hex[:6]}", static_member=True)
    assert worker.joined.wait(WAIT_S)
    first = work("watched", {"wait": False, "n": 1})
    space.produce(first)
    space.wait_results(lambda found: first.run_id in outputs(found))

    # The twin takes the worker's place in the group, then goes away without leaving
    # (a static member's close keeps its place for the session timeout).
    twin = space.transport.consumer(space.group, [space.topic(TopicName.WORK)], worker.worker_id)
    deadline = time.monotonic() + WAIT_S
    while not twin.joined():
        assert time.monotonic() < deadline, "the twin never joined"
        twin.poll(10, 0.1)
    twin.close()

    second = work("watched", {"wait": False, "n": 2})
    space.produce(second)
    found = space.wait_results(lambda found: second.run_id in outputs(found))
    assert outputs(found)[second.run_id] == {"stopped": False}
