"""Emitted events under kill -9 between publish and commit, on the embedded log and Kafka.

An ``emitter`` run's steps emit three events. A real ``processor run`` dies with
``os._exit`` (tests/apps/emission_pipelines.py) right after it produced them into
the open transaction with their ``EventEmitted`` facts (flushed to the broker on
Kafka), before the commit. The transaction never commits (the embedded log rolls it
back; Kafka aborts it when the restarted instance fences it), so a read_committed
consumer never sees that copy. The restarted processor decides the same result again
and publishes the events under the same ids: the topic holds each event once, and
``replay --verify`` agrees with the live store.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from processor.clients.client import Client
from processor.facts.models import EventEmitted, FactHeader, RunSucceeded
from processor.model.emission import event_id
from processor.transport.base import Record
from processor.transport.deployment import Deployment, ensure_topics
from tests.apps.emission_pipelines import CRASH_EXIT
from tests.apps.support import read_topic, wait_until
from tests.faults.crash_env import CrashEnv

pytestmark = pytest.mark.slow

APP = "tests.apps.emission_pipelines:app"


def _topic(deployment: Deployment) -> str:
    """This test's emit topic: under the deployment's prefix (a Kafka space's own)."""
    return f"{deployment.topology.prefix}test.emitted"


def _events(deployment: Deployment, run_id: str) -> list[Record]:
    """The committed events of the run (what a read_committed consumer sees)."""
    reader = deployment.transport.reader()
    try:
        records = read_topic(reader, _topic(deployment), deployment.topology.partitions)
        return [r for r in records if dict(r.headers).get("run-id") == run_id.encode()]
    finally:
        reader.close()


def _uncommitted_ids(deployment: Deployment, run_id: str) -> list[str]:
    """The event ids of the run a read_uncommitted Kafka consumer reads (aborted too)."""
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
        ids: list[str] = []
        partitions = range(deployment.topology.partitions)
        consumer.assign([TopicPartition(_topic(deployment), p, 0) for p in partitions])
        # Until the topic stays quiet (transaction markers take offsets, so the high
        # watermark is no stopping point); the copies were flushed before the kill.
        while (message := consumer.poll(3)) is not None:
            headers = dict(message.headers() or []) if message.error() is None else {}
            if headers.get("run-id") == run_id.encode():
                ids.append(headers["event-id"].decode())
        return ids
    finally:
        consumer.close()


def _count(facts: list[FactHeader], kind: type[FactHeader]) -> int:
    return sum(isinstance(f, kind) for f in facts)


def test_kill_9_between_publishing_emitted_events_and_the_commit(crash_env: CrashEnv) -> None:
    process, deployment = crash_env.process, crash_env.deployment
    process.app = APP
    topic = {"TEST_EMIT_TOPIC": _topic(deployment)}
    process.extra_env = {**topic, "TEST_CRASH_POINT": "after_publish"}
    ensure_topics(deployment, [_topic(deployment)])
    client = Client(deployment.transport, deployment.topology, deployment.settings.state_dir)
    try:
        process.start()
        run_id = client.submit("emitter", "hello").run_id
        proc = process.proc
        assert proc is not None
        wait_until(lambda: proc.poll() is not None, 90, "the crash after publishing")
        assert proc.returncode == CRASH_EXIT, process.log_text()[-3000:]
        process.close()

        # What the crash left: nothing committed, neither the events nor their facts.
        assert _events(deployment, run_id) == []
        assert _count(client.history(run_id), EventEmitted) == 0
        if crash_env.transport == "kafka":  # the copy is in the log, aborted
            assert len(_uncommitted_ids(deployment, run_id)) == 3

        process.extra_env = topic
        process.start()
        assert client.wait(run_id, timeout_s=60).succeeded
        assert process.stop() == 0
        verify = crash_env.cli("replay", "--verify", "--json")
        assert verify.returncode == 0, verify.stdout + verify.stderr
        assert json.loads(verify.stdout)["verified"] is True, verify.stdout
        facts = client.history(run_id)
    finally:
        client.close()

    events = _events(deployment, run_id)
    segment = next(f.segment for f in facts if isinstance(f, EventEmitted))
    expected = [event_id(run_id, segment, s, i) for s, i in ((0, 0), (0, 1), (1, 0))]
    assert sorted(dict(r.headers)["event-id"].decode() for r in events) == sorted(expected)
    assert _count(facts, EventEmitted) == 3
    assert _count(facts, RunSucceeded) == 1
    assert max(Counter(f.fact_key for f in facts).values()) == 1
    if crash_env.transport == "kafka":  # the aborted copy and the committed one: same ids
        assert Counter(_uncommitted_ids(deployment, run_id)) == Counter(expected * 2)
