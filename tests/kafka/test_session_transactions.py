"""A processor session opens its next transaction as it commits one, on a real broker.

``begin_transaction`` is a call into librdkafka's own thread (a few tenths of a
millisecond in the loop); made right after a commit, it is off the next batch's path.
An empty transaction holds nothing on the broker: closing, aborting or being fenced
with one open must lose and leak nothing. Records fetched before a rebalance are not
consumed after it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient

from processor.config.settings import Settings
from processor.errors import FencedError
from processor.transport.base import Outbound, Record, TopicPartition, TopicSpec
from processor.transport.kafka import KafkaTransport
from processor.transport.kafka_session import KafkaSession
from tests.kafka.support import poll_records
from tests.kafka_broker import kafka_bootstrap, unavailable_reason

pytestmark = pytest.mark.kafka

INPUTS = 6


class CountingProducer:
    """A real transactional producer that counts its ``begin_transaction`` calls."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.begun = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def begin_transaction(self) -> None:
        self.begun += 1
        self._real.begin_transaction()


class Space:
    def __init__(self, bootstrap: str, tmp_path: Path) -> None:
        self.bootstrap = bootstrap
        self.transport = KafkaTransport(
            Settings(broker=f"kafka://{bootstrap}", data_dir=tmp_path), session_timeout_ms=6_000
        )
        tag = uuid.uuid4().hex[:12]
        self.source, self.sink, self.group = f"txn.{tag}.in", f"txn.{tag}.out", f"txn-{tag}"

    def session(self) -> tuple[KafkaSession, CountingProducer]:
        """A session of instance ``p1`` (a new one fences the last), its producer counted."""
        session = self.transport.session(self.group, "p1")
        counting = CountingProducer(session._producer)
        session._producer = counting  # type: ignore[assignment]
        session.subscribe([self.source], lambda _: None, lambda _: None)
        return session, counting

    def written(self) -> list[bytes]:
        reader = self.transport.reader()
        try:
            return [
                r.value for batch in reader.read(TopicPartition(self.sink, 0), 0) for r in batch
            ]
        finally:
            reader.close()


@pytest.fixture
def space(tmp_path: Path) -> Iterator[Space]:
    bootstrap = kafka_bootstrap()
    if bootstrap is None:
        pytest.skip(unavailable_reason())
    made = Space(bootstrap, tmp_path)
    admin = made.transport.admin()
    try:
        admin.create_topics([TopicSpec(made.source, 1), TopicSpec(made.sink, 1)])
    finally:
        admin.close()
    producer = made.transport.producer()
    try:
        for index in range(INPUTS):
            producer.produce(Outbound(made.source, b"k", f"input {index}".encode(), (), 0))
        producer.flush()
    finally:
        producer.close()
    yield made
    deleting = AdminClient({"bootstrap.servers": bootstrap})
    for future in deleting.delete_topics([made.source, made.sink]).values():
        future.result()


def commit_one(session: KafkaSession, record: Record, sink: str) -> None:
    session.begin()
    session.produce(Outbound(sink, b"k", record.value, (), 0))
    session.commit({TopicPartition(record.topic, record.partition): record.offset + 1})


def test_a_commit_begins_the_next_transaction_and_an_abort_does_not(space: Space) -> None:
    session, producer = space.session()
    try:
        first, second, third, fourth = poll_records(session, INPUTS)[:4]
        commit_one(session, first, space.sink)
        assert producer.begun == 2  # the first begin, and the next one as it committed
        commit_one(session, second, space.sink)
        assert producer.begun == 3  # begin took the open one: only the commit began one

        session.begin()  # takes the one the last commit opened
        session.produce(Outbound(space.sink, b"k", b"aborted", (), 0))
        session.abort()
        assert producer.begun == 3  # an abort leaves none open ...
        commit_one(session, third, space.sink)
        assert producer.begun == 5  # ... so this begin opened one, and its commit the next
        commit_one(session, fourth, space.sink)
    finally:
        session.close()  # with an empty transaction open
    assert space.written() == [b"input 0", b"input 1", b"input 2", b"input 3"]


def test_a_session_fenced_with_its_next_transaction_open_commits_nothing(space: Space) -> None:
    zombie, _ = space.session()
    inputs = poll_records(zombie, INPUTS)
    commit_one(zombie, inputs[0], space.sink)  # and has begun the next transaction

    successor, _ = space.session()  # the same instance again: its producer fences the first
    try:
        with pytest.raises(FencedError):
            commit_one(zombie, inputs[1], space.sink)  # in the transaction begun before
        zombie.close()  # leaves the group: the successor gets the partition
        again = poll_records(successor, INPUTS - 1)
        assert again[0].offset == inputs[1].offset  # the zombie's first commit counted
        commit_one(successor, again[0], space.sink)
        commit_one(successor, again[1], space.sink)
    finally:
        zombie.close()
        successor.close()
    assert space.written() == [b"input 0", b"input 1", b"input 2"]


class RebalancingConsumer:
    """The real consumer, but the first call that returns records then serves a
    rebalance of their partition, as librdkafka does when a rebalance comes after
    records it had already fetched: the session's revoke callback runs and the
    partition is unassigned; given back, its assign callback runs too and the
    partition is assigned again, as the client does after each callback. The new
    assignment starts fetching only once the client has looked up its committed
    offset, a moment later; with ``fetching``, the call waits for that and returns the
    first record the new assignment fetched too, after the old ones."""

    def __init__(self, real: Any, session: KafkaSession, mode: str) -> None:
        self._real, self._session, self._mode = real, session, mode
        self.rebalanced = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        return self._after(self._real.consume(num_messages, timeout))

    def poll(self, timeout: float) -> Any:
        message = self._real.poll(timeout)
        return message if message is None else self._after([message])[0]

    def _after(self, messages: list[Any]) -> list[Any]:
        if messages and not self.rebalanced:
            self.rebalanced = True
            partitions = [KafkaTopicPartition(messages[0].topic(), messages[0].partition())]
            self._session._revoked_cb(self._real, partitions)
            self._real.unassign()
            if self._mode != "moved":
                self._session._assigned_cb(self._real, partitions)
                self._real.assign(partitions)
            if self._mode == "fetching":
                messages = [*messages, self._first_fetched()]
        return messages

    def _first_fetched(self) -> Any:
        deadline = time.monotonic() + 60
        while (message := self._real.poll(0.1)) is None:
            assert time.monotonic() < deadline, "the new assignment fetched nothing"
        return message


@pytest.mark.parametrize("mode", ["moved", "given_back", "fetching"])
def test_records_fetched_before_a_rebalance_are_not_consumed(space: Space, mode: str) -> None:
    # Consuming them would commit their offsets under the new generation, which the
    # coordinator accepts: a new owner that looked its offset up before would read
    # them again (a trigger's record submitted twice). Given back, the partition is
    # read again from its committed position, also when the new assignment had
    # already fetched past it (those records were dropped with the old ones).
    session, _ = space.session()
    consumer = RebalancingConsumer(session._consumer, session, mode)
    session._consumer = consumer
    try:
        deadline = time.monotonic() + 60
        while not consumer.rebalanced:
            assert time.monotonic() < deadline, "no record arrived"
            assert session.poll(100, 0.1) == []  # the rebalancing poll returns none
        if mode != "moved":  # read again from the committed position (the start: none yet)
            again = poll_records(session, INPUTS)
            assert [r.offset for r in again] == list(range(INPUTS))
            commit_one(session, again[0], space.sink)
    finally:
        session.close()
    assert space.written() == ([] if mode == "moved" else [b"input 0"])
