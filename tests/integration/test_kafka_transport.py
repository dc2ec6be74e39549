"""The Kafka transport against a real Apache Kafka broker: fencing, aborts, markers, admin.

What the conformance suite cannot say transport-neutrally: transactional.id
fencing, transaction markers occupying offsets, read_committed end offsets, topic
configs on a real broker, murmur2 placement by librdkafka itself.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as KafkaTopicPartition

from processor.config.settings import Settings
from processor.errors import FencedError, TransportError
from processor.transport.base import (
    GroupConsumer,
    Outbound,
    ProcessorSession,
    Record,
    TopicPartition,
    TopicSpec,
)
from processor.transport.kafka import KafkaTransport
from processor.transport.partitioner import partition_for
from tests.kafka_broker import kafka_bootstrap, unavailable_reason

pytestmark = pytest.mark.kafka

DEADLINE_S = 30.0
Closing = Callable[[Any], Any]


@pytest.fixture
def transport(tmp_path: Path) -> KafkaTransport:
    bootstrap = kafka_bootstrap()
    if bootstrap is None:
        pytest.skip(unavailable_reason())
    settings = Settings(broker=f"kafka://{bootstrap}", data_dir=tmp_path / "data")
    return KafkaTransport(settings, session_timeout_ms=6_000, max_poll_interval_ms=6_000)


@pytest.fixture
def closing() -> Iterator[Closing]:
    clients: list[Any] = []

    def register(client: Any) -> Any:
        clients.append(client)
        return client

    yield register
    for client in reversed(clients):
        client.close()


@pytest.fixture
def make_topic(transport: KafkaTransport) -> Callable[..., str]:
    def make(partitions: int = 2, **config: str) -> str:
        name = f"it.{uuid.uuid4().hex[:12]}"
        admin = transport.admin()
        try:
            assert admin.create_topics([TopicSpec(name, partitions, config)]) == [name]
        finally:
            admin.close()
        return name

    return make


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def produce_all(transport: KafkaTransport, records: Sequence[Outbound]) -> None:
    producer = transport.producer()
    try:
        for record in records:
            producer.produce(record)
        producer.flush()
    finally:
        producer.close()


def read_all(transport: KafkaTransport, tp: TopicPartition, start: int = 0) -> list[Record]:
    reader = transport.reader()
    try:
        return [record for batch in reader.read(tp, start) for record in batch]
    finally:
        reader.close()


def read_topic(transport: KafkaTransport, topic: str, partitions: int) -> list[Record]:
    return [r for p in range(partitions) for r in read_all(transport, TopicPartition(topic, p))]


def poll_until(client: ProcessorSession | GroupConsumer, count: int) -> list[Record]:
    deadline = time.monotonic() + DEADLINE_S
    records: list[Record] = []
    while len(records) < count:
        left = deadline - time.monotonic()
        assert left > 0, f"polled {len(records)} of {count} records before the deadline"
        records.extend(client.poll(500, min(left, 0.5)))
    return records


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"waited in vain for {what}"
        time.sleep(0.01)


def high_watermark(tp: TopicPartition) -> int:
    """The end of ``tp`` including uncommitted records (read_uncommitted)."""
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap(),
            "group.id": unique("probe"),
            "isolation.level": "read_uncommitted",
        }
    )
    try:
        return int(consumer.get_watermark_offsets(KafkaTopicPartition(*tp), timeout=10)[1])
    finally:
        consumer.close()


def next_offsets(records: Sequence[Record]) -> dict[TopicPartition, int]:
    positions: dict[TopicPartition, int] = {}
    for record in records:
        positions[record.position] = max(positions.get(record.position, 0), record.offset + 1)
    return positions


def subscribed(
    transport: KafkaTransport, closing: Closing, group: str, instance: str, topics: list[str]
) -> ProcessorSession:
    session: ProcessorSession = closing(transport.session(group, instance))
    session.subscribe(topics, lambda _: None, lambda _: None)
    return session


def committed_in_transaction(
    transport: KafkaTransport, closing: Closing, source: str, sink: Sequence[Outbound]
) -> list[tuple[TopicPartition, int]]:
    """Produce ``sink`` in one committed transaction of a fresh session on ``source``."""
    session = subscribed(transport, closing, unique("g"), "writer", [source])
    session.begin()
    for record in sink:
        session.produce(record)
    return session.commit({})


# -- fencing ------------------------------------------------------------------------------


def test_same_transactional_id_fences_the_zombie_and_hides_its_transaction(
    transport: KafkaTransport, make_topic: Callable[..., str], closing: Closing
) -> None:
    source, sink = make_topic(2), make_topic(2)
    produce_all(transport, [Outbound(source, b"k%d" % i, b"in-%d" % i) for i in range(10)])
    group = unique("group")
    zombie = subscribed(transport, closing, group, "instance", [source])
    inputs = poll_until(zombie, 10)
    zombie.begin()
    for i in range(5):
        zombie.produce(Outbound(sink, b"k%d" % i, b"zombie"))
    wait_for(
        lambda: sum(high_watermark(TopicPartition(sink, p)) for p in (0, 1)) == 5,
        "the zombie's records on the broker",
    )

    # Same group and instance id, so the same transactional.id: init_transactions in
    # subscribe bumps the producer epoch and aborts the zombie's open transaction.
    successor = subscribed(transport, closing, group, "instance", [source])
    with pytest.raises(FencedError):
        zombie.commit(next_offsets(inputs))
    assert read_topic(transport, sink, 2) == []
    with pytest.raises(FencedError):
        zombie.begin()
    with pytest.raises(FencedError):
        zombie.poll(10, 0.0)
    zombie.close()  # leaves the group: the successor gets every partition

    taken_over = poll_until(successor, 10)
    assert sorted(r.value or b"" for r in taken_over) == sorted(b"in-%d" % i for i in range(10))
    successor.begin()
    successor.produce(Outbound(sink, b"k0", b"successor"))
    successor.commit(next_offsets(taken_over))
    assert [r.value for r in read_topic(transport, sink, 2)] == [b"successor"]


def test_a_member_evicted_for_not_polling_cannot_commit(
    transport: KafkaTransport, make_topic: Callable[..., str], closing: Closing
) -> None:
    source, sink = make_topic(1), make_topic(1)
    produce_all(transport, [Outbound(source, b"k", b"in")])
    group = unique("group")
    zombie = subscribed(transport, closing, group, "a", [source])
    inputs = poll_until(zombie, 1)
    zombie.begin()
    zombie.produce(Outbound(sink, b"k", b"zombie"))
    wait_for(lambda: high_watermark(TopicPartition(sink, 0)) == 1, "the zombie's record")
    # Another instance (another transactional.id) gets the partition only once the
    # zombie is evicted after max.poll.interval.ms without a poll.
    successor = subscribed(transport, closing, group, "b", [source])
    assert [r.value for r in poll_until(successor, 1)] == [b"in"]
    with pytest.raises(FencedError):
        zombie.commit(next_offsets(inputs))
    assert read_all(transport, TopicPartition(sink, 0)) == []


# -- aborts and transaction markers -------------------------------------------------------


def test_abort_leaves_nothing_visible_and_later_commits_read_cleanly(
    transport: KafkaTransport, make_topic: Callable[..., str], closing: Closing
) -> None:
    source, sink = make_topic(1), make_topic(1)
    tp = TopicPartition(sink, 0)
    session = subscribed(transport, closing, unique("g"), "a", [source])
    session.begin()
    for i in range(50):
        session.produce(Outbound(sink, b"k", b"aborted-%d" % i))
    # Abort only once the records are on the broker: librdkafka purges records still
    # queued locally, which would leave nothing to abort.
    wait_for(lambda: high_watermark(tp) == 50, "the transaction's records on the broker")
    session.abort()
    assert read_all(transport, tp) == []

    session.begin()
    session.produce(Outbound(sink, b"k", b"kept"))
    [(position, offset)] = session.commit({})
    assert (position, offset) == (tp, 51)  # after 50 aborted records and the abort marker
    [record] = read_all(transport, tp)  # visible as soon as commit returns
    assert (record.offset, record.value) == (51, b"kept")
    reader = closing(transport.reader())
    assert reader.end_offset(tp) == 53  # the commit marker takes offset 52


def test_read_stops_at_the_end_when_the_last_offsets_are_markers(
    transport: KafkaTransport, make_topic: Callable[..., str], closing: Closing
) -> None:
    source, sink = make_topic(1), make_topic(1)
    tp = TopicPartition(sink, 0)
    committed_in_transaction(transport, closing, source, [Outbound(sink, b"k", b"a")] * 3)
    session = subscribed(transport, closing, unique("g"), "aborter", [source])
    session.begin()
    session.produce(Outbound(sink, b"k", b"aborted"))
    wait_for(lambda: high_watermark(tp) == 5, "the aborted record on the broker")
    session.abort()
    # offsets: 0-2 records, 3 commit marker, 4 aborted record, 5 abort marker; the
    # coordinator writes the abort marker after abort_transaction returns.
    reader = closing(transport.reader())
    wait_for(lambda: reader.end_offset(tp) == 6, "the abort marker")
    started = time.monotonic()
    for start, end, expected in [
        (0, None, [0, 1, 2]),
        (0, 6, [0, 1, 2]),
        (1, 4, [1, 2]),
        (3, None, []),
        (4, None, []),
        (5, 6, []),
        (3, 6, []),
    ]:
        offsets = [r.offset for batch in reader.read(tp, start, end) for r in batch]
        assert offsets == expected, (start, end)
    # A read that ends on markers returns at the EOF event, not after a timeout.
    assert time.monotonic() - started < 5.0


def test_end_offset_stops_before_an_open_transaction(
    transport: KafkaTransport, make_topic: Callable[..., str], closing: Closing
) -> None:
    source, sink = make_topic(1), make_topic(1)
    tp = TopicPartition(sink, 0)
    produce_all(transport, [Outbound(sink, b"k", b"before")] * 2)
    session = subscribed(transport, closing, unique("g"), "a", [source])
    session.begin()
    session.produce(Outbound(sink, b"k", b"pending"))
    producer = closing(transport.producer())
    producer.produce(Outbound(sink, b"k", b"after"))
    producer.flush()
    reader = closing(transport.reader())
    assert reader.end_offset(tp) == 2  # the last stable offset, not the high watermark
    assert [r.value for batch in reader.read(tp, 0) for r in batch] == [b"before"] * 2
    session.commit({})
    values = [r.value for batch in reader.read(tp, 0) for r in batch]
    assert values == [b"before", b"before", b"pending", b"after"]


def test_a_new_read_supersedes_an_unfinished_one(
    transport: KafkaTransport, make_topic: Callable[..., str], closing: Closing
) -> None:
    topic = make_topic(2)
    produce_all(transport, [Outbound(topic, b"k", b"%d" % i, partition=i % 2) for i in range(200)])
    reader = closing(transport.reader())
    first = reader.read(TopicPartition(topic, 0), 0, batch_size=10)
    assert len(next(first)) <= 10
    second = [r for batch in reader.read(TopicPartition(topic, 1), 0) for r in batch]
    assert [r.value for r in second] == [b"%d" % i for i in range(1, 200, 2)]
    with pytest.raises(TransportError, match="superseded"):
        next(first)


def test_records_read_equal_records_built_by_their_constructor(
    transport: KafkaTransport, make_topic: Callable[..., str], closing: Closing
) -> None:
    topic = make_topic(1)
    tp = TopicPartition(topic, 0)
    headers = (("type", b"RunSubmitted"), ("empty", b""))
    produce_all(transport, [Outbound(topic, b"k", b"v", headers, partition=0)])
    [record] = read_all(transport, tp)
    session = subscribed(transport, closing, unique("g"), "a", [topic])
    [polled] = poll_until(session, 1)
    expected = Record(topic, 0, 0, b"k", b"v", headers, record.timestamp_ms)
    assert record == polled == expected
    assert hash(record) == hash(polled) == hash(expected)
    assert record.timestamp_ms > 0
    with pytest.raises(AttributeError):
        record.value = b"changed"  # type: ignore[misc]


# -- placement ----------------------------------------------------------------------------


def test_records_land_on_the_murmur2_partition_of_their_key(
    transport: KafkaTransport, make_topic: Callable[..., str], closing: Closing
) -> None:
    source, topic = make_topic(1), make_topic(6)
    keys = [f"run-{uuid.uuid4()}".encode() for _ in range(200)]
    produce_all(transport, [Outbound(topic, key, b"plain") for key in keys])
    positions = committed_in_transaction(
        transport, closing, source, [Outbound(topic, key, b"txn") for key in keys]
    )
    assert [tp.partition for tp, _ in positions] == [partition_for(key, 6) for key in keys]
    records = read_topic(transport, topic, 6)
    assert len(records) == 400
    for record in records:
        assert record.key is not None
        assert record.partition == partition_for(record.key, 6)


# -- admin --------------------------------------------------------------------------------


def test_admin_creates_missing_topics_and_describes_partitions_and_configs(
    transport: KafkaTransport, closing: Closing
) -> None:
    admin = closing(transport.admin())
    compacted, plain = unique("it.compacted"), unique("it.plain")
    specs = [
        TopicSpec(compacted, 3, {"cleanup.policy": "compact", "min.compaction.lag.ms": "1000"}),
        TopicSpec(plain, 0, {"retention.ms": "3600000"}),  # 0: the default partition count
    ]
    assert sorted(admin.create_topics(specs)) == sorted([compacted, plain])
    assert admin.create_topics(specs) == []
    described = admin.describe_topics()
    assert described[compacted].partitions == 3
    assert described[compacted].config == {
        "cleanup.policy": "compact",
        "min.compaction.lag.ms": "1000",
    }
    assert described[plain].partitions == transport.settings.partitions
    assert described[plain].config == {"retention.ms": "3600000"}
    assert not [name for name in described if name.startswith("__")]


# -- worker consumers ---------------------------------------------------------------------


def test_group_consumer_resumes_after_its_committed_offsets(
    transport: KafkaTransport, make_topic: Callable[..., str]
) -> None:
    topic = make_topic(2)
    produce_all(transport, [Outbound(topic, b"k%d" % i, b"%d" % i) for i in range(20)])
    group = unique("workers")
    consumer = transport.consumer(group, [topic])
    try:
        first = poll_until(consumer, 20)
        done = sorted(first, key=lambda r: (r.partition, r.offset))[:8]
        consumer.commit(next_offsets(done))
    finally:
        consumer.close()
    restarted = transport.consumer(group, [topic])
    try:
        # At least once: everything after the committed offsets comes again.
        again = poll_until(restarted, 12)
    finally:
        restarted.close()
    committed = next_offsets(done)
    expected = {(r.partition, r.offset) for r in first if r.offset >= committed.get(r.position, 0)}
    assert {(r.partition, r.offset) for r in again} == expected


def test_producer_flush_reports_a_partition_that_does_not_exist(
    transport: KafkaTransport, make_topic: Callable[..., str], closing: Closing
) -> None:
    topic = make_topic(2)
    producer = closing(transport.producer())
    with pytest.raises(TransportError):
        producer.produce(Outbound(topic, b"k", b"v", partition=7))
        producer.flush(10.0)


def test_a_static_member_fenced_by_its_twin_says_so_instead_of_polling_nothing(
    transport: KafkaTransport, make_topic: Callable[..., str], closing: Closing
) -> None:
    # A broker outage can leave a static member's old identity behind: the member that
    # comes back with the same group.instance.id fences it, and librdkafka makes that
    # fatal for the old consumer. Polling it then returns nothing forever; the worker
    # that owns it must learn it is dead to open a new one.
    topic = make_topic(2)
    group = unique("workers")
    first = closing(transport.consumer(group, [topic], "w0"))
    wait_for(lambda: bool(first.poll(10, 0.1)) or first.joined(), "the first member to join")
    twin = closing(transport.consumer(group, [topic], "w0"))
    wait_for(lambda: bool(twin.poll(10, 0.1)) or twin.joined(), "its twin to join")

    def first_fenced() -> bool:
        try:
            first.commit_soon({TopicPartition(topic, 0): 0})  # as a worker commits
            first.poll(10, 0.1)
        except FencedError:
            return True
        return False

    wait_for(first_fenced, "the fenced member to raise FencedError")
    produce_all(transport, [Outbound(topic, b"k%d" % i, b"%d" % i) for i in range(4)])
    assert len(poll_until(twin, 4)) == 4  # the twin owns the group's partitions


def test_a_new_owner_waits_for_the_offsets_its_predecessor_sent_to_commit(
    transport: KafkaTransport, make_topic: Callable[..., str], closing: Closing
) -> None:
    # A processor frozen (SIGSTOP) between sending its offsets to the transaction and
    # committing it is evicted; the partition's new owner must not take it over, and
    # catch its store up from the facts topic, until that transaction has ended: if it
    # commits, its facts and its offsets become visible together, and an owner that had
    # caught up before would never fold those facts nor see those inputs again.
    # A transaction timeout longer than the pause: the frozen one can still commit.
    transport = KafkaTransport(
        transport.settings,
        session_timeout_ms=6_000,
        max_poll_interval_ms=6_000,
        transaction_timeout_ms=60_000,
    )
    source, sink = make_topic(1), make_topic(1)
    produce_all(transport, [Outbound(source, b"k", b"in")])
    group = unique("group")
    frozen = subscribed(transport, closing, group, "a", [source])
    inputs = poll_until(frozen, 1)
    frozen.begin()
    frozen.produce(Outbound(sink, b"k", b"fact"))
    frozen._send_offsets(next_offsets(inputs))  # where SIGSTOP froze it

    seen_at_assignment: list[list[bytes | None]] = []
    successor: ProcessorSession = closing(transport.session(group, "b"))

    def assigned(_: Sequence[TopicPartition]) -> None:
        seen_at_assignment.append([r.value for r in read_all(transport, TopicPartition(sink, 0))])

    successor.subscribe([source], assigned, lambda _: None)
    # Evicted after 6 s, the partition reassigned, one committed-offsets lookup (10 s)
    # given up: all before it resumes.
    paused_s = 30.0
    resumed = threading.Timer(paused_s, lambda: frozen._producer.commit_transaction(30))
    resumed.start()
    try:
        deadline = time.monotonic() + 90
        while not seen_at_assignment:
            assert time.monotonic() < deadline, "the successor was never assigned"
            assert successor.poll(10, 0.2) == []  # the input's offset is committed
    finally:
        resumed.join()
    assert seen_at_assignment == [[b"fact"]]


def test_a_partition_given_back_after_a_hold_is_read_again(
    transport: KafkaTransport, make_topic: Callable[..., str], closing: Closing
) -> None:
    # processor run's workers join held (paused), so that they start work together. A
    # partition the first one held and lost to the second, as the second joined, stays
    # paused in librdkafka: once it came back (the second member gone, as when another
    # instance of the fleet dies), the first read nothing of it, and the work items on
    # it waited forever (a takeover test's stall).
    topic = make_topic(2)
    group = unique("workers")
    first = closing(transport.consumer(group, [topic]))
    first.hold(True)  # as a worker joins, before the others of its process
    wait_for(lambda: bool(first.poll(10, 0.1)) or first.joined(), "the first member to join")
    second = closing(transport.consumer(group, [topic]))
    second.hold(True)

    def both_hold_one() -> bool:
        first.poll(10, 0.1)
        second.poll(10, 0.1)
        return assigned(first) == 1 and assigned(second) == 1

    wait_for(both_hold_one, "the second member to take one partition")
    first.hold(False)
    second.close()  # it leaves: its partition comes back to the first
    wait_for(lambda: not first.poll(10, 0.1) and assigned(first) == 2, "both partitions back")
    produce_all(transport, [Outbound(topic, b"k%d" % i, b"%d" % i) for i in range(8)])
    partitions = {r.partition for r in poll_until(first, 8)}
    assert partitions == {0, 1}


def assigned(consumer: GroupConsumer) -> int:
    """How many partitions librdkafka assigns ``consumer`` now (a test's look inside)."""
    return len(consumer._consumer.assignment())  # type: ignore[attr-defined]
