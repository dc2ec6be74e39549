"""One behaviour for every transport: order, atomic commits, abort, restart, fencing.

Written against the protocols of ``processor.transport.base`` only; the
``transport`` fixture (conftest) supplies each implementation. Tests at the end
marked ``embedded only`` pin down details the Kafka transport is not required to
share.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.errors import FencedError, TransportError
from processor.transport.base import (
    GroupConsumer,
    Outbound,
    ProcessorSession,
    Record,
    TopicPartition,
    TopicSpec,
    Transport,
)
from processor.transport.embedded_sqlite import decode_headers, encode_headers
from processor.transport.partitioner import partition_for

TopicFactory = Callable[..., str]

Closing = Callable[[Any], Any]
Pollable = ProcessorSession | GroupConsumer

POLL_DEADLINE_S = 30.0


# -- helpers ------------------------------------------------------------------------------


def produce_all(transport: Transport, records: Sequence[Outbound]) -> None:
    """Produce ``records`` with a plain producer and flush them."""
    producer = transport.producer()
    try:
        for record in records:
            producer.produce(record)
        producer.flush()
    finally:
        producer.close()


def read_partition(transport: Transport, tp: TopicPartition, start: int = 0) -> list[Record]:
    """Every committed record of ``tp`` from ``start`` to its current end."""
    reader = transport.reader()
    try:
        return [record for batch in reader.read(tp, start) for record in batch]
    finally:
        reader.close()


def read_topic(transport: Transport, topic: str, partitions: int) -> list[Record]:
    """Every committed record of ``topic``, partition by partition."""
    return [
        record
        for partition in range(partitions)
        for record in read_partition(transport, TopicPartition(topic, partition))
    ]


def end_offsets(transport: Transport, topic: str, partitions: int) -> list[int]:
    """The end offset of every partition of ``topic``."""
    reader = transport.reader()
    try:
        return [reader.end_offset(TopicPartition(topic, p)) for p in range(partitions)]
    finally:
        reader.close()


def dense_offsets(transport: Transport) -> bool:
    """Whether only visible records take offsets (embedded); in Kafka, transaction
    markers and aborted records take offsets too, so only what is readable counts."""
    return transport.name == "embedded"


def poll_until(client: Pollable, count: int, max_records: int = 500) -> list[Record]:
    """Poll until ``count`` records arrived; fail at the deadline."""
    deadline = time.monotonic() + POLL_DEADLINE_S
    records: list[Record] = []
    while len(records) < count:
        left = deadline - time.monotonic()
        assert left > 0, f"polled {len(records)} of {count} records before the deadline"
        records.extend(client.poll(max_records, min(left, 0.5)))
    return records


def assert_quiet(client: Pollable, wait_s: float = 0.3) -> None:
    """Assert that polling for ``wait_s`` returns nothing."""
    deadline = time.monotonic() + wait_s
    while (left := deadline - time.monotonic()) > 0:
        assert client.poll(100, left) == []


def next_offsets(records: Sequence[Record]) -> dict[TopicPartition, int]:
    """The consumed position after ``records``: last offset + 1 per partition."""
    positions: dict[TopicPartition, int] = {}
    for record in records:
        positions[record.position] = max(positions.get(record.position, 0), record.offset + 1)
    return positions


def ids(records: Sequence[Record]) -> list[tuple[str, int, int]]:
    """(topic, partition, offset) of each record."""
    return [(r.topic, r.partition, r.offset) for r in records]


class Assignments:
    """Records what on_assign / on_revoke were called with."""

    def __init__(self) -> None:
        self.assigned: list[list[TopicPartition]] = []
        self.revoked: list[list[TopicPartition]] = []

    def on_assign(self, partitions: Sequence[TopicPartition]) -> None:
        self.assigned.append(list(partitions))

    def on_revoke(self, partitions: Sequence[TopicPartition]) -> None:
        self.revoked.append(list(partitions))


def subscribed(
    transport: Transport, closing: Closing, group: str, instance: str, topics: list[str]
) -> tuple[ProcessorSession, Assignments]:
    """A session of ``group`` subscribed to ``topics``, closed at teardown."""
    session: ProcessorSession = closing(transport.session(group, instance))
    assignments = Assignments()
    session.subscribe(topics, assignments.on_assign, assignments.on_revoke)
    return session, assignments


def fill(transport: Transport, topic: str, count: int, prefix: str = "in") -> list[Outbound]:
    """Produce ``count`` records with a handful of keys to ``topic``."""
    records = [
        Outbound(topic, f"{prefix}-key-{i % 7}".encode(), f"{prefix}-{i}".encode())
        for i in range(count)
    ]
    produce_all(transport, records)
    return records


def unique_group() -> str:
    return f"group-{random.getrandbits(48):012x}"


# -- order and placement ------------------------------------------------------------------


def test_records_of_one_key_keep_produce_order_on_the_murmur2_partition(
    transport: Transport, make_topic: TopicFactory
) -> None:
    topic = make_topic(partitions=4)
    keys = [f"run-{k:03d}".encode() for k in range(40)]
    rng = random.Random(7)
    sequence = {key: 0 for key in keys}
    outbound = []
    for _ in range(2000):
        key = rng.choice(keys)
        outbound.append(Outbound(topic, key, b"%d" % sequence[key]))
        sequence[key] += 1
    produce_all(transport, outbound)

    by_key: dict[bytes, list[Record]] = defaultdict(list)
    for record in read_topic(transport, topic, 4):
        assert record.key is not None
        by_key[record.key].append(record)
    assert set(by_key) == set(keys)
    for key, records in by_key.items():
        assert {r.partition for r in records} == {partition_for(key, 4)}
        assert [r.value for r in records] == [b"%d" % i for i in range(sequence[key])]


def test_offsets_are_dense_from_zero_per_partition(
    transport: Transport, make_topic: TopicFactory
) -> None:
    topic = make_topic(partitions=3)
    fill(transport, topic, 300)
    for partition in range(3):
        records = read_partition(transport, TopicPartition(topic, partition))
        assert [r.offset for r in records] == list(range(len(records)))
    assert sum(end_offsets(transport, topic, 3)) == 300


def test_explicit_partition_headers_and_timestamp_round_trip(
    transport: Transport, make_topic: TopicFactory
) -> None:
    topic = make_topic(partitions=4)
    headers = (
        ("type", b"RunSubmitted"),
        ("é-ünï", b""),
        ("bin", bytes(range(256))),
        ("type", b"x"),
    )
    before = int(time.time() * 1000)
    produce_all(transport, [Outbound(topic, b"k", b"v", headers=headers, partition=2)])
    after = int(time.time() * 1000)
    [record] = read_partition(transport, TopicPartition(topic, 2))
    assert (record.key, record.value, record.headers) == (b"k", b"v", headers)
    assert before - 1000 <= record.timestamp_ms <= after + 1000


def test_create_topics_creates_only_missing_ones_and_describes_them(
    transport: Transport, make_topic: TopicFactory, closing: Closing
) -> None:
    topic = make_topic(partitions=3, **{"cleanup.policy": "delete"})
    admin = closing(transport.admin())
    assert admin.create_topics([TopicSpec(topic, 3)]) == []
    spec = admin.describe_topics()[topic]
    assert (spec.name, spec.partitions) == (topic, 3)
    assert spec.config.get("cleanup.policy") == "delete"


def test_deliver_returns_where_the_record_was_written(
    transport: Transport, make_topic: TopicFactory, closing: Closing
) -> None:
    topic = make_topic(partitions=3)
    fill(transport, topic, 10)  # offsets to land after
    producer = closing(transport.producer())
    producer.produce(Outbound(topic, b"buffered", b"before"))  # delivered first, in order
    tp, offset = producer.deliver(Outbound(topic, b"run-7", b"the completion"))
    assert tp == TopicPartition(topic, partition_for(b"run-7", 3))
    [stored] = [r for r in read_partition(transport, tp) if r.offset == offset]
    assert (stored.key, stored.value) == (b"run-7", b"the completion")
    before = [r for r in read_topic(transport, topic, 3) if r.value == b"before"]
    assert len(before) == 1, "what was produced before is delivered too"
    again = producer.deliver(Outbound(topic, b"run-7", b"again"))
    assert again[0] == tp and again[1] > offset


def test_admin_reads_the_offsets_a_processor_group_committed(
    transport: Transport, make_topic: TopicFactory, closing: Closing
) -> None:
    source, sink = make_topic(partitions=2), make_topic(partitions=1)
    fill(transport, source, 12)
    group = unique_group()
    admin = closing(transport.admin())
    tps = [TopicPartition(source, p) for p in range(2)]
    assert admin.committed_offsets(group, tps) == {}  # nothing committed yet
    session, _ = subscribed(transport, closing, group, "a", [source])
    first = poll_until(session, 12)[:5]
    session.begin()
    session.produce(Outbound(sink, b"k", b"with the offsets"))
    session.commit(next_offsets(first))
    # Kafka writes a transaction's markers after its commit returns: visible soon after.
    deadline = time.monotonic() + POLL_DEADLINE_S
    while (committed := admin.committed_offsets(group, tps)) != next_offsets(first):
        assert committed == {}, committed  # never anything but nothing or all of it
        assert time.monotonic() < deadline, "the committed offsets never showed"
        time.sleep(0.05)  # polling the broker with a deadline
    assert admin.committed_offsets(group, tps[:1]) == {
        tp: o for tp, o in next_offsets(first).items() if tp == tps[0]
    }
    assert admin.committed_offsets(unique_group(), tps) == {}  # another group's: none


# -- reader -------------------------------------------------------------------------------


def test_reader_returns_exactly_the_requested_range(
    transport: Transport, make_topic: TopicFactory, closing: Closing
) -> None:
    topic = make_topic(partitions=2)
    tp = TopicPartition(topic, 1)
    produce_all(transport, [Outbound(topic, b"k", b"%d" % i, partition=1) for i in range(100)])
    reader = closing(transport.reader())
    assert reader.end_offset(tp) == 100
    assert reader.end_offset(TopicPartition(topic, 0)) == 0

    batches = list(reader.read(tp, 10, 50, batch_size=7))
    assert all(0 < len(batch) <= 7 for batch in batches)
    records = [r for batch in batches for r in batch]
    assert [r.offset for r in records] == list(range(10, 50))
    assert [r.value for r in records] == [b"%d" % i for i in range(10, 50)]
    assert all(r.position == tp for r in records)

    assert [r.offset for batch in reader.read(tp, 90) for r in batch] == list(range(90, 100))
    assert list(reader.read(tp, 100)) == []
    assert list(reader.read(tp, 5, 5)) == []


def test_read_values_yields_the_values_read_yields_with_resumable_offsets(
    transport: Transport, make_topic: TopicFactory, closing: Closing
) -> None:
    topic = make_topic(partitions=1)
    tp = TopicPartition(topic, 0)
    produce_all(transport, [Outbound(topic, b"k", b"%d" % i, partition=0) for i in range(40)])
    # A committed transaction (on Kafka: a commit marker takes an offset) after them.
    source = make_topic(partitions=1)
    fill(transport, source, 3)
    session, _ = subscribed(transport, closing, unique_group(), "a", [source])
    consumed = poll_until(session, 3)
    session.begin()
    for i in range(40, 45):
        session.produce(Outbound(topic, b"k", b"%d" % i, partition=0))
    session.commit(next_offsets(consumed))
    reader = closing(transport.reader())
    end = reader.end_offset(tp)

    batches = list(reader.read_values(tp, 5, batch_size=7))
    assert all(0 < len(batch.values) <= 7 for batch in batches)
    expected = [r.value for batch in reader.read(tp, 5) for r in batch]
    assert [v for batch in batches for v in batch.values] == expected
    assert expected == [b"%d" % i for i in range(5, 45)]
    # Each next offset resumes exactly after its batch.
    for batch, following in itertools.pairwise(batches):
        first = next(iter(reader.read_values(tp, batch.next_offset, batch_size=1)))
        assert first.values == following.values[:1]
    assert batches[-1].next_offset <= end
    assert list(reader.read_values(tp, batches[-1].next_offset)) == []
    assert list(reader.read_values(tp, 10, 10)) == []


def test_reader_builds_each_batch_without_collections(
    transport: Transport, make_topic: TopicFactory, closing: Closing
) -> None:
    """A batch's records or values hold no reference cycles: the reader pauses the
    cyclic collector while it builds one, so the thousands of objects of a bulk read
    (replay, restore) do not trigger collections that walk the whole heap."""
    topic = make_topic(partitions=1)
    tp = TopicPartition(topic, 0)
    produce_all(transport, [Outbound(topic, b"k", b"%d" % i, partition=0) for i in range(500)])
    reader = closing(transport.reader())
    reader.end_offset(tp)  # metadata first: only the batches are measured
    collections = 0

    def count(phase: str, info: dict[str, int]) -> None:
        nonlocal collections
        collections += phase == "start"

    threshold = gc.get_threshold()
    gc.set_threshold(1)  # unpaused, every tracked allocation would start a collection
    gc.callbacks.append(count)
    try:
        values = next(iter(reader.read_values(tp, 0)))
        records = next(iter(reader.read(tp, 0)))
    finally:
        gc.callbacks.remove(count)
        gc.set_threshold(*threshold)
    assert len(values.values) >= 100 and len(records) >= 100
    # A few, from the reader's own queries around the batches; unpaused, 500 or more.
    assert collections < 50, collections


def test_no_collection_walks_the_batch_being_read(
    transport: Transport, make_topic: TopicFactory, closing: Closing
) -> None:
    """The reader frees what a batch was read from (Kafka messages, database rows)
    before it lets the cyclic collector run again: no collection started during a bulk
    read finds thousands of them among the young objects it walks."""
    topic = make_topic(partitions=1)
    tp = TopicPartition(topic, 0)
    produce_all(transport, [Outbound(topic, b"k", b"%d" % i, partition=0) for i in range(2000)])
    reader = closing(transport.reader())
    reader.end_offset(tp)
    most_young = 0

    def young_at_start(phase: str, info: dict[str, int]) -> None:
        nonlocal most_young
        if phase == "start":
            most_young = max(most_young, len(gc.get_objects(generation=0)))

    threshold = gc.get_threshold()
    gc.set_threshold(100)
    gc.callbacks.append(young_at_start)
    try:
        read = sum(len(batch.values) for batch in reader.read_values(tp, 0, batch_size=2000))
    finally:
        gc.callbacks.remove(young_at_start)
        gc.set_threshold(*threshold)
    assert read == 2000
    assert most_young < 1000, most_young


def test_reader_default_end_is_the_end_when_read_is_called(
    transport: Transport, make_topic: TopicFactory, closing: Closing
) -> None:
    topic = make_topic(partitions=1)
    tp = TopicPartition(topic, 0)
    produce_all(transport, [Outbound(topic, b"k", b"old", partition=0)] * 10)
    reader = closing(transport.reader())
    batches = reader.read(tp, 0, batch_size=3)
    produce_all(transport, [Outbound(topic, b"k", b"new", partition=0)] * 10)
    records = [r for batch in batches for r in batch]
    assert [r.value for r in records] == [b"old"] * 10


# -- processor sessions -------------------------------------------------------------------


def test_commit_publishes_records_and_offsets_atomically(
    transport: Transport, make_topic: TopicFactory, closing: Closing
) -> None:
    source, sink = make_topic(partitions=2), make_topic(partitions=3)
    fill(transport, source, 20)
    group = unique_group()
    session, assignments = subscribed(transport, closing, group, "a", [source])
    inputs = poll_until(session, 20)
    assert assignments.assigned, "on_assign must run before records are returned"
    assert set(assignments.assigned[-1]) == {TopicPartition(source, p) for p in range(2)}

    session.begin()
    outbound = [Outbound(sink, r.key or b"", b"out:" + (r.value or b"")) for r in inputs]
    for record in outbound:
        session.produce(record)
    positions = session.commit(next_offsets(inputs))

    assert len(positions) == len(outbound)
    for (tp, offset), sent in zip(positions, outbound, strict=True):
        assert tp.partition == partition_for(sent.key, 3)
        [stored] = read_partition(transport, tp, offset)[:1]
        assert (stored.offset, stored.key, stored.value) == (offset, sent.key, sent.value)
    assert len(read_topic(transport, sink, 3)) == 20
    if dense_offsets(transport):
        assert sum(end_offsets(transport, sink, 3)) == 20

    session.close()
    resumed, _ = subscribed(transport, closing, group, "b", [source])
    assert_quiet(resumed)
    more = fill(transport, source, 5, prefix="more")
    again = poll_until(resumed, 5)
    assert sorted(r.value or b"" for r in again) == sorted(o.value for o in more)


def test_abort_leaves_no_trace_and_input_is_polled_again(
    transport: Transport, make_topic: TopicFactory, closing: Closing
) -> None:
    source, sink = make_topic(partitions=2), make_topic(partitions=2)
    fill(transport, source, 10)
    group = unique_group()
    session, _ = subscribed(transport, closing, group, "a", [source])
    first = poll_until(session, 10)

    session.begin()
    for record in first:
        session.produce(Outbound(sink, b"k", record.value or b""))
    session.abort()
    assert read_topic(transport, sink, 2) == []
    if dense_offsets(transport):
        assert end_offsets(transport, sink, 2) == [0, 0]

    second = poll_until(session, 10)
    assert sorted(ids(second)) == sorted(ids(first))
    session.begin()
    session.produce(Outbound(sink, b"k", b"aborted again"))
    session.abort()
    session.close()

    # The group's offsets did not move: a new instance starts from the beginning.
    fresh, _ = subscribed(transport, closing, group, "b", [source])
    third = poll_until(fresh, 10)
    assert sorted(ids(third)) == sorted(ids(first))
    fresh.begin()
    fresh.produce(Outbound(sink, b"k", b"once"))
    fresh.commit(next_offsets(third))
    assert [r.value for r in read_topic(transport, sink, 2)] == [b"once"]
    assert_quiet(fresh)


def test_restart_resumes_exactly_at_the_committed_position(
    transport: Transport, make_topic: TopicFactory, closing: Closing
) -> None:
    source = make_topic(partitions=3)
    fill(transport, source, 60)
    group = unique_group()
    session, _ = subscribed(transport, closing, group, "a", [source])
    polled = poll_until(session, 60)
    by_partition: dict[int, list[Record]] = defaultdict(list)
    for record in sorted(polled, key=lambda r: (r.partition, r.offset)):
        by_partition[record.partition].append(record)
    processed = [r for records in by_partition.values() for r in records[: len(records) // 2]]

    session.begin()  # offsets only: no records produced
    assert session.commit(next_offsets(processed)) == []
    session.close()

    restarted, _ = subscribed(transport, closing, group, "b", [source])
    expected = set(ids(polled)) - set(ids(processed))
    resumed = poll_until(restarted, len(expected))
    assert set(ids(resumed)) == expected
    assert len(resumed) == len(expected)
    assert_quiet(restarted)


def test_a_second_instance_fences_the_first(
    transport: Transport, make_topic: TopicFactory, closing: Closing
) -> None:
    source, sink = make_topic(partitions=2), make_topic(partitions=2)
    fill(transport, source, 10)
    group = unique_group()
    zombie, _ = subscribed(transport, closing, group, "instance-a", [source])
    inputs = poll_until(zombie, 10)
    zombie.begin()
    zombie.produce(Outbound(sink, b"k", b"from the zombie"))

    successor, _ = subscribed(transport, closing, group, "instance-b", [source])
    taken_over = poll_until(successor, 10)
    with pytest.raises(FencedError):
        zombie.commit(next_offsets(inputs))
    assert read_topic(transport, sink, 2) == []
    if dense_offsets(transport):
        assert end_offsets(transport, sink, 2) == [0, 0]

    successor.begin()
    successor.produce(Outbound(sink, b"k", b"from the successor"))
    first_partition = [r for r in taken_over if r.partition == 0]
    successor.commit(next_offsets(first_partition))
    assert [r.value for r in read_topic(transport, sink, 2)] == [b"from the successor"]

    # The zombie's offsets were not committed either: the successor's are the group's.
    zombie.close()
    successor.close()
    third, _ = subscribed(transport, closing, group, "instance-c", [source])
    rest = [r for r in taken_over if r.partition != 0]
    assert sorted(ids(poll_until(third, len(rest)))) == sorted(ids(rest))
    assert_quiet(third)


# -- worker consumers ---------------------------------------------------------------------


def test_competing_consumers_get_disjoint_records_covering_everything(
    transport: Transport, make_topic: TopicFactory
) -> None:
    topic = make_topic(partitions=4)
    total = 400
    group = unique_group()
    received: dict[int, list[Record]] = {0: [], 1: []}
    errors: list[BaseException] = []
    ready = threading.Barrier(len(received) + 1)
    done = threading.Event()

    def work(member: int) -> None:
        try:
            consumer = transport.consumer(group, [topic])
            try:
                ready.wait()
                while not done.is_set():
                    records = consumer.poll(7, 0.1)
                    received[member].extend(records)
                    consumer.commit(next_offsets(records))
            finally:
                consumer.close()
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)
            ready.abort()

    threads = [threading.Thread(target=work, args=(m,)) for m in received]
    for thread in threads:
        thread.start()
    with contextlib.suppress(threading.BrokenBarrierError):  # errors are asserted below
        ready.wait(timeout=POLL_DEADLINE_S)
        fill(transport, topic, total)
    deadline = time.monotonic() + POLL_DEADLINE_S
    while sum(map(len, received.values())) < total and time.monotonic() < deadline and not errors:
        time.sleep(0.01)
    done.set()
    for thread in threads:
        thread.join()

    assert not errors, errors
    first, second = (set(ids(received[m])) for m in received)
    assert not first & second
    assert len(first | second) == total == len(received[0]) + len(received[1])


def test_a_commit_sent_without_waiting_is_stored_once_the_consumer_closes(
    transport: Transport, make_topic: TopicFactory
) -> None:
    topic = make_topic(partitions=1)
    group = unique_group()
    fill(transport, topic, 10)
    first = transport.consumer(group, [topic])
    taken: list[Record] = []
    try:
        deadline = time.monotonic() + POLL_DEADLINE_S
        while len(taken) < 6 and time.monotonic() < deadline:
            taken.extend(first.poll(6 - len(taken), 0.1))
        assert len(taken) == 6
        first.commit_soon(next_offsets(taken))  # returns before the broker answers
    finally:
        first.close()  # waits for the commit on its way
    second = transport.consumer(group, [topic])
    rest: list[Record] = []
    try:
        deadline = time.monotonic() + POLL_DEADLINE_S
        while len(rest) < 4 and time.monotonic() < deadline:
            rest.extend(second.poll(10, 0.1))
    finally:
        second.close()
    assert sorted(r.offset for r in rest) == list(range(6, 10))  # the first 6: not again


# -- embedded only ------------------------------------------------------------------------


# Behaviour specific to the embedded log: these tests run on that transport only.
embedded_only = pytest.mark.parametrize("transport", ["embedded"], indirect=True)


@embedded_only
def test_unknown_topics_are_refused_by_name(transport: Transport, closing: Closing) -> None:
    producer = closing(transport.producer())
    with pytest.raises(TransportError, match="no-such-topic"):
        producer.produce(Outbound("no-such-topic", b"k", b"v"))
    session = closing(transport.session(unique_group(), "a"))
    with pytest.raises(TransportError, match="no-such-topic"):
        session.subscribe(["no-such-topic"], lambda _: None, lambda _: None)
    with pytest.raises(TransportError, match="no-such-topic"):
        transport.consumer(unique_group(), ["no-such-topic"])
    reader = closing(transport.reader())
    with pytest.raises(TransportError, match="no-such-topic"):
        reader.end_offset(TopicPartition("no-such-topic", 0))


@embedded_only
def test_partition_out_of_range_is_refused(
    transport: Transport, make_topic: TopicFactory, closing: Closing
) -> None:
    topic = make_topic(partitions=2)
    producer = closing(transport.producer())
    with pytest.raises(TransportError, match="partition 2"):
        producer.produce(Outbound(topic, b"k", b"v", partition=2))
    reader = closing(transport.reader())
    with pytest.raises(TransportError, match="partition -1"):
        reader.end_offset(TopicPartition(topic, -1))


@embedded_only
def test_session_transaction_misuse_is_refused(
    transport: Transport, make_topic: TopicFactory, closing: Closing
) -> None:
    topic = make_topic(partitions=1)
    session = closing(transport.session(unique_group(), "a"))
    with pytest.raises(TransportError, match="before subscribe"):
        session.poll(1, 0.0)
    session.subscribe([topic], lambda _: None, lambda _: None)
    with pytest.raises(TransportError, match="outside a transaction"):
        session.produce(Outbound(topic, b"k", b"v"))
    with pytest.raises(TransportError, match="without begin"):
        session.commit({})
    session.begin()
    with pytest.raises(TransportError, match="already open"):
        session.begin()


@embedded_only
def test_fenced_session_revokes_on_the_next_poll_and_stays_fenced(
    transport: Transport, make_topic: TopicFactory, closing: Closing
) -> None:
    topic = make_topic(partitions=2)
    group = unique_group()
    zombie, zombie_calls = subscribed(transport, closing, group, "a", [topic])
    assert zombie.poll(10, 0.0) == []
    subscribed(transport, closing, group, "b", [topic])
    with pytest.raises(FencedError, match="'b'"):
        zombie.poll(10, 0.0)
    assert (
        zombie_calls.revoked
        == zombie_calls.assigned
        == [[TopicPartition(topic, p) for p in (0, 1)]]
    )
    with pytest.raises(FencedError):
        zombie.begin()


@embedded_only
def test_close_revokes_the_assignment(transport: Transport, make_topic: TopicFactory) -> None:
    topic = make_topic(partitions=1)
    session = transport.session(unique_group(), "a")
    calls = Assignments()
    session.subscribe([topic], calls.on_assign, calls.on_revoke)
    session.poll(1, 0.0)
    session.close()
    session.close()
    assert calls.revoked == [[TopicPartition(topic, 0)]]


@embedded_only
def test_poll_shares_max_records_fairly_across_partitions(
    transport: Transport, make_topic: TopicFactory, closing: Closing
) -> None:
    topic = make_topic(partitions=4)
    produce_all(transport, [Outbound(topic, b"k", b"v", partition=i % 4) for i in range(4 * 50)])
    session, _ = subscribed(transport, closing, unique_group(), "a", [topic])
    records = session.poll(20, 1.0)
    assert sorted(r.partition for r in records) == sorted([0, 1, 2, 3] * 5)
    consumer = closing(transport.consumer(unique_group(), [topic]))
    records = consumer.poll(9, 1.0)
    counts = sorted(sum(1 for r in records if r.partition == p) for p in range(4))
    assert counts == [2, 2, 2, 3]


@embedded_only
def test_competing_consumers_take_turns(
    transport: Transport, make_topic: TopicFactory, closing: Closing
) -> None:
    topic = make_topic(partitions=4)
    fill(transport, topic, 100)
    group = unique_group()
    members = [closing(transport.consumer(group, [topic])) for _ in range(2)]
    received: list[list[Record]] = [[], []]
    while sum(map(len, received)) < 100:
        for member, consumer in enumerate(members):
            received[member].extend(consumer.poll(7, 0.0))
    assert [len(records) for records in received] == [51, 49]
    assert not set(ids(received[0])) & set(ids(received[1]))


@embedded_only
def test_poll_waits_for_records_committed_meanwhile(
    transport: Transport, make_topic: TopicFactory, closing: Closing
) -> None:
    topic = make_topic(partitions=1)
    consumer = closing(transport.consumer(unique_group(), [topic]))
    assert consumer.poll(10, 0.0) == []
    producer = threading.Thread(target=fill, args=(transport, topic, 3))
    producer.start()
    records = poll_until(consumer, 3)
    producer.join()
    assert len(records) == 3


@embedded_only
def test_producer_flushes_by_itself_when_the_buffer_is_full(
    transport: Transport, make_topic: TopicFactory, closing: Closing
) -> None:
    topic = make_topic(partitions=1)
    producer = closing(transport.producer())
    for _ in range(1000):
        producer.produce(Outbound(topic, b"k", b"v"))
    assert end_offsets(transport, topic, 1) == [1000]


_header_pairs = st.lists(st.tuples(st.text(), st.binary()), max_size=5).map(tuple)


@given(_header_pairs)
def test_embedded_header_encoding_round_trips_exactly(
    headers: tuple[tuple[str, bytes], ...],
) -> None:
    blob = encode_headers(headers)
    assert (decode_headers(blob) if blob is not None else ()) == headers


# -- static members: work held by a member that went away ---------------------------------


def test_a_static_member_back_with_its_id_gets_what_it_held_at_once(
    transport: Transport, make_topic: TopicFactory, closing: Closing
) -> None:
    """The in-process workers of a killed processor: back with the same instance id, a
    member is handed again what it polled and never committed, without waiting for a
    session timeout or a lease (the deadline of ``poll_until`` is far shorter)."""
    topic = make_topic(partitions=2)
    fill(transport, topic, 6)
    group = unique_group()
    first = transport.consumer(group, [topic], "proc-1-w0")
    held = poll_until(first, 6)
    first.commit({TopicPartition(topic, r.partition): r.offset + 1 for r in held[:1]})
    first.close()  # gone before it finished (and committed) the rest
    began = time.monotonic()
    again = closing(transport.consumer(group, [topic], "proc-1-w0"))
    redelivered = poll_until(again, 5)
    assert set(ids(redelivered)) == set(ids(held)) - set(ids(held[:1]))
    assert time.monotonic() - began < 10.0
