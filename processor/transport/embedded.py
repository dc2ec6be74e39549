"""The embedded log: the default transport when no Kafka broker is configured.

A local, file-backed log on SQLite with topics, partitions, dense offsets and
atomic multi-record commits, safe for several processes at once (the processor
commits while a CLI ``submit`` appends and ``processor worker`` processes consume).
It is a single-machine convenience, not a distributed engine: moving to Kafka is
a URL change. The storage layer is ``embedded_sqlite``; the processor session and
the worker consumer live in ``embedded_session`` and ``embedded_consumer``.

Every client object owns one SQLite connection: use each from one thread at a
time; create one per thread instead of sharing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from processor.config.settings import default_of
from processor.transport.base import (
    Closeable,
    Outbound,
    Reader,
    Record,
    TopicPartition,
    TopicSpec,
    ValueBatch,
)
from processor.transport.embedded_consumer import EmbeddedConsumer
from processor.transport.embedded_session import EmbeddedSession
from processor.transport.embedded_sqlite import (
    DB_FILE_NAME,
    SESSION_OFFSETS,
    LogConnection,
    PendingRecord,
    TopicMeta,
    initialize_log,
)
from processor.transport.fact_batches import FactBatchReader
from processor.transport.gc_pause import gc_paused

if TYPE_CHECKING:
    from processor.transport.base import (
        AdminClient,
        GroupConsumer,
        ProcessorSession,
        Producer,
        Reader,
        Transport,
    )

__all__ = [
    "EmbeddedAdmin",
    "EmbeddedConsumer",
    "EmbeddedProducer",
    "EmbeddedReader",
    "EmbeddedSession",
    "EmbeddedTransport",
]

logger = logging.getLogger(__name__)

_FLUSH_AT = 1000
_INSERT_TOPIC = (
    "INSERT INTO topics (name, id, partitions, config)"
    " VALUES (?, (SELECT coalesce(max(id), 0) + 1 FROM topics), ?, ?)"
)
_SELECT_TOPIC_ID = "SELECT id FROM topics WHERE name = ?"
_INSERT_PARTITION = "INSERT INTO partitions (topic_id, partition, next_offset) VALUES (?, ?, 0)"


class _Client(Closeable):
    """Owns the connection of one client object; a context manager closing it."""

    def __init__(self, db_file: Path, durable: bool) -> None:
        self._log = LogConnection(db_file, durable)

    def close(self) -> None:
        """Close the connection."""
        self._log.close()


class EmbeddedProducer(_Client):
    """A plain producer: buffers records and appends them in one transaction per flush.

    The buffer is flushed when it holds ``flush_at`` records and on ``close``.
    Producing to an unknown topic or to a partition that does not exist raises
    ``TransportError`` right away. If a flush fails the records stay buffered.
    """

    def __init__(self, db_file: Path, durable: bool, *, flush_at: int = _FLUSH_AT) -> None:
        super().__init__(db_file, durable)
        self._flush_at = flush_at
        self._buffer: list[PendingRecord] = []

    def produce(self, record: Outbound) -> None:
        """Buffer ``record``; flush when the buffer is full."""
        self._buffer.append(self._log.pending(record))
        if len(self._buffer) >= self._flush_at:
            self.flush()

    def flush(self, timeout_s: float = 30.0) -> None:
        """Append every buffered record in one transaction.

        ``timeout_s`` is accepted for the protocol; the write waits for other
        writers up to the connection's busy timeout.
        """
        if self._buffer:
            with self._log.write("append records"):
                self._log.append(self._buffer)
            self._buffer = []

    def deliver(self, record: Outbound, timeout_s: float = 30.0) -> tuple[TopicPartition, int]:
        """Append the buffered records and ``record`` in one transaction; where it went."""
        batch = [*self._buffer, self._log.pending(record)]
        with self._log.write("append records"):
            positions = self._log.append(batch)
        self._buffer = []
        return positions[-1]

    def close(self) -> None:
        """Flush, then close the connection."""
        if self._log.closed:
            return
        try:
            self.flush()
        finally:
            super().close()


class EmbeddedReader(_Client):
    """Reads committed records of one partition at a time, outside any group."""

    def end_offset(self, tp: TopicPartition) -> int:
        """The offset the next record of ``tp`` will get."""
        return self._log.end_offset(self._log.checked_partition(tp), tp.partition)

    def wait_stable(self, tp: TopicPartition, timeout_s: float) -> bool:
        """Always stable: a commit is one SQLite transaction, never left open."""
        self._log.checked_partition(tp)
        return True

    def read(
        self, tp: TopicPartition, start: int, end: int | None = None, batch_size: int = 10_000
    ) -> Iterator[list[Record]]:
        """Yield non-empty batches of records in ``[start, end)`` in offset order.

        ``end`` defaults to the end of the partition when ``read`` is called.
        """
        meta, stop = self._range(tp, start, end, batch_size)
        return self._batches(meta, tp.partition, start, stop, batch_size)

    def read_values(
        self, tp: TopicPartition, start: int, end: int | None = None, batch_size: int = 10_000
    ) -> Iterator[ValueBatch]:
        """``read``, yielding only the values of each batch."""
        meta, stop = self._range(tp, start, end, batch_size)
        return self._value_batches(meta, tp.partition, start, stop, batch_size)

    def _range(
        self, tp: TopicPartition, start: int, end: int | None, batch_size: int
    ) -> tuple[TopicMeta, int]:
        if start < 0 or batch_size < 1:
            raise ValueError(
                f"read needs start >= 0 and batch_size >= 1, got {start}, {batch_size}"
            )
        meta = self._log.checked_partition(tp)
        return meta, self._log.end_offset(meta, tp.partition) if end is None else end

    def _batches(
        self, meta: TopicMeta, partition: int, start: int, stop: int, batch_size: int
    ) -> Iterator[list[Record]]:
        while start < stop:
            with gc_paused():  # see _value_batches
                batch = self._log.fetch(meta, partition, start, stop, batch_size)
            if not batch:
                return
            yield batch
            start = batch[-1].offset + 1

    def _value_batches(
        self, meta: TopicMeta, partition: int, start: int, stop: int, batch_size: int
    ) -> Generator[ValueBatch, int | None, None]:
        while start < stop:
            # A batch's rows and values hold no reference cycles: the collections their
            # allocation would trigger (walking every long-lived object too) are pure
            # cost, as in the Kafka reader, which pauses the collector the same way.
            with gc_paused():
                batch = self._log.fetch_values(meta, partition, start, stop, batch_size)
            if batch is None:
                return
            asked = yield batch
            if asked:  # a new batch size (Reader.read_values)
                batch_size = asked
            start = batch.next_offset


class EmbeddedAdmin(_Client):
    """Creates and describes topics."""

    def __init__(self, db_file: Path, durable: bool, *, default_partitions: int) -> None:
        super().__init__(db_file, durable)
        self._default_partitions = default_partitions

    def create_topics(self, specs: Sequence[TopicSpec]) -> list[str]:
        """Create the missing topics; return the names created.

        A spec with fewer than one partition gets the transport's default count,
        like Kafka's ``num_partitions=-1``. Existing topics are left as they are.
        """
        created: list[str] = []
        with self._log.write("create topics") as conn:
            for spec in specs:
                if conn.execute(_SELECT_TOPIC_ID, (spec.name,)).fetchone() is None:
                    self._insert_topic(spec)
                    created.append(spec.name)
                else:
                    logger.debug("topic %s exists; left unchanged", spec.name)
        return created

    def describe_topics(self) -> dict[str, TopicSpec]:
        """Every topic: name -> TopicSpec(name, partitions, config)."""
        return {
            name: TopicSpec(name, meta.partitions, dict(meta.config), 1, 1)
            for name, meta in self._log.topics().items()
        }

    def committed_offsets(
        self, group: str, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, int]:
        """The offsets the sessions of ``group`` committed (with their transactions)."""
        stored = self._log.load_positions(SESSION_OFFSETS, group)
        return {tp: stored[tp] for tp in partitions if tp in stored}

    def _insert_topic(self, spec: TopicSpec) -> None:
        if not spec.name:
            raise ValueError("a topic needs a name")
        partitions = spec.partitions if spec.partitions >= 1 else self._default_partitions
        conn = self._log.conn
        conn.execute(_INSERT_TOPIC, (spec.name, partitions, json.dumps(dict(spec.config))))
        topic_id = conn.execute(_SELECT_TOPIC_ID, (spec.name,)).fetchone()[0]
        conn.executemany(_INSERT_PARTITION, [(topic_id, p) for p in range(partitions)])
        logger.info("created topic %s with %d partitions", spec.name, partitions)


class EmbeddedTransport:
    """Factory for the clients of one embedded log (a directory holding ``log.sqlite3``).

    Args:
        path: the directory of the log; created if missing.
        durable: ``synchronous=FULL`` (survives power loss) instead of ``NORMAL``
            (survives process crashes, faster).
        default_partitions: the partition count of topics created without one.
    """

    name = "embedded"

    def __init__(
        self,
        path: str | Path,
        *,
        durable: bool = False,
        default_partitions: int = default_of("partitions"),
    ) -> None:
        if default_partitions < 1:
            raise ValueError(f"default_partitions must be >= 1, got {default_partitions}")
        self.path = Path(path)
        self.db_file = self.path / DB_FILE_NAME
        self.durable = durable
        self.default_partitions = default_partitions
        initialize_log(self.db_file, durable)

    def session(self, group: str, instance_id: str) -> EmbeddedSession:
        """A processor session (consumer + transactional producer) in ``group``."""
        return EmbeddedSession(self.db_file, self.durable, group, instance_id)

    def producer(self) -> EmbeddedProducer:
        """A plain producer."""
        return EmbeddedProducer(self.db_file, self.durable)

    def consumer(
        self, group: str, topics: Sequence[str], instance_id: str | None = None
    ) -> EmbeddedConsumer:
        """A competing consumer of ``topics`` in ``group`` (see EmbeddedConsumer)."""
        return EmbeddedConsumer(self.db_file, self.durable, group, topics, instance_id)

    def reader(self) -> Reader:
        """A reader of committed records (fact batches expanded)."""
        return FactBatchReader(EmbeddedReader(self.db_file, self.durable))

    def admin(self) -> EmbeddedAdmin:
        """An admin client."""
        return EmbeddedAdmin(self.db_file, self.durable, default_partitions=self.default_partitions)


if TYPE_CHECKING:
    # Static proof that the embedded clients implement the transport protocols.
    def _conforms(
        transport: EmbeddedTransport,
    ) -> tuple[Transport, ProcessorSession, Producer, GroupConsumer, Reader, AdminClient]:
        return (
            transport,
            transport.session("g", "i"),
            transport.producer(),
            transport.consumer("g", ()),
            transport.reader(),
            transport.admin(),
        )
