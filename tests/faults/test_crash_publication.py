"""The terminal publication barrier under kill -9, on the embedded log and on Kafka.

A ``publisher`` run (``output_topic``) ends with ``TerminalPublicationPrepared``,
then the loop produces the publication, ``TerminalPublicationCompleted`` and
``RunSucceeded`` in one transaction. A real ``processor run`` dies with
``os._exit`` (tests/apps/publication_crash.py) at one point of that path and is
restarted, then stopped, replayed with ``--verify`` and started once more:

- killed after the publication was produced (and flushed to the broker on Kafka),
  before the commit: the transaction never commits (the embedded log rolls it back;
  Kafka aborts it when the restarted instance fences it), so a read_committed
  consumer never sees that copy; the restart publishes again with the same
  idempotency key and the output topic holds exactly one record of the run;
- killed once the commit is done (before or after RocksDB applied it): never
  published again, whatever restarts and replays follow.

Each time ``TerminalPublicationCompleted``, ``RunSucceeded`` and the outcome on
runs.results are there once.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from processor.clients.client import Client
from processor.facts.models import (
    FactHeader,
    RunSucceeded,
    TerminalPublicationCompleted,
    TerminalPublicationPrepared,
)
from processor.facts.topics import TopicName
from processor.transport.base import Record
from processor.transport.deployment import Deployment, ensure_topics
from tests.apps.publication_crash import CRASH_EXIT, CRASH_POINTS
from tests.apps.support import read_topic, wait_until
from tests.faults.crash_env import CrashEnv

pytestmark = pytest.mark.slow

APP = "tests.apps.publication_crash:app"


def _count(facts: list[FactHeader], kind: type[FactHeader]) -> int:
    return sum(isinstance(f, kind) for f in facts)


def _keyed(deployment: Deployment, topic: str, run_id: str) -> list[Record]:
    """The committed records of ``topic`` keyed by ``run_id`` (what a read_committed
    consumer of the topic sees of the run)."""
    reader = deployment.transport.reader()
    try:
        records = read_topic(reader, topic, deployment.topology.partitions)
        return [r for r in records if r.key == run_id.encode()]
    finally:
        reader.close()


def _published_topic(deployment: Deployment) -> str:
    """The output topic of this test: under the deployment's prefix (a Kafka space's
    topics are its own, and deleted with it)."""
    return f"{deployment.topology.prefix}test.published"


def _published(deployment: Deployment, run_id: str) -> list[Record]:
    return _keyed(deployment, _published_topic(deployment), run_id)


def _uncommitted(deployment: Deployment, run_id: str) -> int:
    """How many records of the run a read_uncommitted Kafka consumer of the output
    topic reads (aborted ones included)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": str(deployment.settings.broker).removeprefix("kafka://"),
            "group.id": f"uncommitted-{run_id}",
            "isolation.level": "read_uncommitted",
            "enable.auto.commit": False,
        }
    )
    try:
        topic, seen = _published_topic(deployment), 0
        partitions = range(deployment.topology.partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        # Until the topic stays quiet (transaction markers take offsets, so the high
        # watermark is no stopping point); the copies were flushed before the kill.
        while (message := consumer.poll(3)) is not None:
            if message.error() is None:
                seen += message.key() == run_id.encode()
        return seen
    finally:
        consumer.close()


def _outcomes(deployment: Deployment, run_id: str) -> list[Record]:
    return _keyed(deployment, deployment.topology.name(TopicName.OUTCOMES), run_id)


def _publish_one_more(client: Client, deployment: Deployment, n: int) -> None:
    """A new run published end to end: the restarted loop has restored its partitions
    and scanned its due timers several times since (so a stale publication would be out)."""
    run_id = client.submit("publisher", {"sentinel": n}).run_id
    assert client.wait(run_id, timeout_s=60).succeeded
    wait_until(lambda: _published(deployment, run_id), 30, "the sentinel's publication")


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_kill_9_around_the_terminal_publication(crash_env: CrashEnv, point: str) -> None:
    process, deployment = crash_env.process, crash_env.deployment
    process.app = APP
    topic = {"TEST_PUBLISHED_TOPIC": _published_topic(deployment)}
    process.extra_env = {**topic, "TEST_CRASH_POINT": point}
    ensure_topics(deployment, [_published_topic(deployment)])
    client = Client(deployment.transport, deployment.topology, deployment.settings.state_dir)
    try:
        process.start()
        run_id = client.submit("publisher", "hello").run_id
        proc = process.proc
        assert proc is not None
        wait_until(lambda: proc.poll() is not None, 90, f"the crash at {point}")
        assert proc.returncode == CRASH_EXIT, process.log_text()[-3000:]
        process.close()

        # What the crash left: the publication is visible exactly when its Completed is.
        committed = 0 if point == "after_publish" else 1
        assert len(_published(deployment, run_id)) == committed
        facts = client.history(run_id)
        assert _count(facts, TerminalPublicationPrepared) == 1
        assert _count(facts, TerminalPublicationCompleted) == committed
        assert _count(facts, RunSucceeded) == committed
        assert len(_outcomes(deployment, run_id)) == committed

        if crash_env.transport == "kafka":  # the copy is in the log, aborted or not
            assert _uncommitted(deployment, run_id) == 1

        process.extra_env = topic
        process.start()
        assert client.wait(run_id, timeout_s=60).succeeded
        _publish_one_more(client, deployment, 1)
        assert process.stop() == 0

        verify = crash_env.cli("replay", "--verify", "--json")
        assert verify.returncode == 0, verify.stdout + verify.stderr
        assert json.loads(verify.stdout)["verified"] is True, verify.stdout

        process.start()  # on the replayed store
        _publish_one_more(client, deployment, 2)
        assert process.stop() == 0
        facts = client.history(run_id)
    finally:
        client.close()

    published = _published(deployment, run_id)
    # Redone after a crash before Completed (the first copy aborted); never again after.
    assert len(published) == 1
    if crash_env.transport == "kafka":  # read_uncommitted: the aborted copy too
        assert _uncommitted(deployment, run_id) == (2 if point == "after_publish" else 1)
    keys = {dict(r.headers)["idempotency-key"] for r in published}
    assert keys == {f"{run_id}/terminal".encode()}
    assert [json.loads(r.value or b"") for r in published] == [{"published": "hello"}] * len(
        published
    )
    assert [f.seq for f in facts] == list(range(1, len(facts) + 1))
    assert max(Counter(f.fact_key for f in facts).values()) == 1
    assert _count(facts, TerminalPublicationPrepared) == 1
    assert _count(facts, TerminalPublicationCompleted) == 1
    assert _count(facts, RunSucceeded) == 1
    assert len(_outcomes(deployment, run_id)) == 1
