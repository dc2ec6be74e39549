"""Runs triggered from users' own topics, on both transports (a processor host in-process).

The user topics have 3 partitions (the run topics 4) and keys unrelated to run
ids; records are produced by a plain producer, as a user's application would.
"""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from processor.config.settings import Settings
from processor.engine.host import Host
from processor.facts.codec import codec
from processor.facts.models import CommandReply, Rejected, RunSucceeded
from processor.facts.topics import TopicName
from processor.transport.base import Outbound, Reader, Record, TopicSpec, Transport
from processor.transport.deployment import Deployment
from processor.worker.trigger import DECODE_FAILED, MAPPING_FAILED
from tests.apps.pipelines import expected_steps3_result
from tests.apps.support import read_topic, wait_until
from tests.apps.trigger_pipelines import ORDERS, UNIQUE, expected_order_runs, trigger_app
from tests.kafka.support import FactsWatch, KafkaSpace, assert_exactly_once, read_facts
from tests.kafka_broker import kafka_bootstrap, unavailable_reason

USER_PARTITIONS = 3


@dataclass
class Setup:
    deployment: Deployment
    prefix: str

    @property
    def transport(self) -> Transport:
        return self.deployment.transport


def _settings(kind: str, tmp_path: Path) -> tuple[Settings, KafkaSpace | None]:
    if kind == "embedded":
        return Settings(data_dir=tmp_path / "data", topic_prefix="t."), None
    bootstrap = kafka_bootstrap()
    if bootstrap is None:
        pytest.skip(unavailable_reason())
    space = KafkaSpace.new(bootstrap)
    return space.settings(tmp_path / "data"), space


@pytest.fixture(params=["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def setup(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Setup]:
    """A deployment with the user topics created (3 partitions each)."""
    settings, space = _settings(request.param, tmp_path)
    deployment = Deployment.from_settings(settings)
    prefix = settings.topic_prefix
    admin = deployment.transport.admin()
    try:
        specs = [TopicSpec(prefix + name, USER_PARTITIONS) for name in (ORDERS, UNIQUE)]
        admin.create_topics(specs)
        wait_until(lambda: {s.name for s in specs} <= admin.describe_topics().keys(), 30, "topics")
    finally:
        admin.close()
    try:
        yield Setup(deployment, prefix)
    finally:
        if space is not None:
            space.delete_topics()


@pytest.fixture
def host(setup: Setup) -> Iterator[Host]:
    running = Host(setup.deployment, trigger_app(setup.prefix), workers=2)
    running.start()
    try:
        yield running
    finally:
        running.stop()
    assert not running.errors, running.errors


def produce(setup: Setup, topic: str, values: list[bytes]) -> None:
    """Produce ``values`` to ``topic``, keyed by random customer ids (not run ids)."""
    rng = random.Random(7)
    producer = setup.transport.producer()
    try:
        for value in values:
            key = f"customer-{rng.randrange(50)}".encode()
            producer.produce(Outbound(setup.prefix + topic, key, value))
        producer.flush()
    finally:
        producer.close()


def user_records(reader: Reader, setup: Setup, topic: str) -> list[Record]:
    return list(read_topic(reader, setup.prefix + topic, USER_PARTITIONS))


def trigger_rejections(reader: Reader, setup: Setup, topic: str) -> list[Rejected]:
    topology = setup.deployment.topology
    records = read_topic(reader, topology.name(TopicName.REJECTED), topology.partitions)
    found = [codec().decode_as(r.value, Rejected) for r in records]
    return [r for r in found if r.source_topic == setup.prefix + topic]


def test_each_record_of_a_user_topic_starts_one_run_and_bad_ones_are_kept(
    setup: Setup, host: Host
) -> None:
    good = [json.dumps({"n": n, "note": uuid.uuid4().hex}).encode() for n in range(60)]
    not_json = [b"{not json", b"\xff\xfe"]
    unmappable = [b'{"m": 1}']
    values = good[:30] + not_json + good[30:] + unmappable
    produce(setup, ORDERS, values)
    reader = setup.transport.reader()
    try:
        records = wait_until(
            lambda: len(got := user_records(reader, setup, ORDERS)) == len(values) and got,
            30,
            "the user records",
        )
        assert len({r.partition for r in records}) == USER_PARTITIONS  # keys spread them
        expected = expected_order_runs(setup.prefix, records)
        assert len(expected) == len(good)
        assert sorted(expected.values()) == list(range(60))

        watch = FactsWatch(reader, setup.deployment.topology)
        wait_until(lambda: watch.all_ended(expected), 90, "every triggered run to end", 0.2)
        host.stop()  # nothing more may happen: then count

        # Exactly one run per good record, each succeeding once with its own input.
        assert_exactly_once(
            read_facts(reader, setup.deployment.topology), expected, result=expected_steps3_result
        )
        rejections = trigger_rejections(reader, setup, ORDERS)
        bad = {r.value: r for r in records if r.value in not_json + unmappable}
        assert Counter(r.original_value for r in rejections) == Counter(bad.keys())
        for rejection in rejections:
            source = bad[rejection.original_value]
            assert (rejection.source_partition, rejection.source_offset) == (
                source.partition,
                source.offset,
            )
            assert rejection.original_key == source.key
            want = MAPPING_FAILED if rejection.original_value in unmappable else DECODE_FAILED
            assert rejection.reason == want, rejection
        (mapping,) = [r for r in rejections if r.reason == MAPPING_FAILED]
        assert mapping.detail == "KeyError: 'n'"
        assert host.triggers is not None
        assert (host.triggers.submitted, host.triggers.rejected) == (len(good), len(bad))
    finally:
        reader.close()


def test_records_with_the_same_idempotency_field_start_one_run(setup: Setup, host: Host) -> None:
    orders = [{"order_id": f"o-{i}", "total": i} for i in range(5)]
    produce(setup, UNIQUE, [json.dumps(o).encode() for o in [*orders, *orders[:3]]])
    reader = setup.transport.reader()
    try:
        topology = setup.deployment.topology

        def succeeded() -> list[RunSucceeded]:
            return [f for f in read_facts(reader, topology) if isinstance(f, RunSucceeded)]

        def replies(count: int) -> list[CommandReply]:
            records = read_topic(reader, topology.name(TopicName.REPLIES), topology.partitions)
            found = [codec().decode_as(r.value, CommandReply) for r in records]
            return found if len(found) == count else []

        wait_until(lambda: len(succeeded()) >= len(orders), 60, "one run per order", 0.2)
        wait_until(lambda: replies(8), 30, "every submit answered")
        # Once o-0's run exists: the same order id with another input is refused. (Before,
        # records on different partitions could reach the processor in either order.)
        produce(setup, UNIQUE, [json.dumps({"order_id": "o-0", "total": 99}).encode()])
        answered = wait_until(lambda: replies(9), 30, "the conflicting submit answered")
        host.stop()

        results = sorted(json.loads(f.result)["order_id"] for f in succeeded())
        assert results == [o["order_id"] for o in orders]  # one run each, none twice
        assert len({reply.run_id for reply in answered}) == len(orders)
        outcomes = Counter((reply.created, reply.refusal) for reply in answered)
        assert outcomes == {(True, None): 5, (False, None): 3, (False, "idempotency_conflict"): 1}
        assert trigger_rejections(reader, setup, UNIQUE) == []
    finally:
        reader.close()


def test_a_trigger_on_a_topic_not_yet_created_waits_for_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(data_dir=tmp_path / "data", topic_prefix="late.")
    setup = Setup(Deployment.from_settings(settings), "late.")
    host = Host(setup.deployment, trigger_app("late."), workers=1)
    host.start()
    reader = setup.transport.reader()
    try:
        wait_until(lambda: "unknown topic" in caplog.text, 30, "the trigger to say it waits")
        admin = setup.transport.admin()
        try:
            admin.create_topics([TopicSpec("late." + n, USER_PARTITIONS) for n in (ORDERS, UNIQUE)])
        finally:
            admin.close()
        produce(setup, ORDERS, [b'{"n": 4}'])
        topology = setup.deployment.topology

        def succeeded() -> list[RunSucceeded]:
            return [f for f in read_facts(reader, topology) if isinstance(f, RunSucceeded)]

        (done,) = wait_until(succeeded, 30, "the run of the late topic's record", 0.2)
        assert json.loads(done.result) == expected_steps3_result(4)
    finally:
        reader.close()
        host.stop()
    assert not host.errors, host.errors
