"""The seam between the engine and a log: Kafka or the embedded default.

Both transports implement these protocols with the same behaviour, proven by one
conformance suite (tests/conformance): per-key order, atomic commit of produced
records together with consumed offsets, abort leaves no trace, restart resumes at
the committed position.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, Self

__all__ = [
    "AdminClient",
    "Closeable",
    "GroupConsumer",
    "Outbound",
    "PartitionsCallback",
    "ProcessorSession",
    "Producer",
    "Reader",
    "Record",
    "TopicPartition",
    "TopicSpec",
    "Transport",
    "ValueBatch",
]

Headers = tuple[tuple[str, bytes], ...]


class Closeable:
    """A client that ``with`` closes at the end of the block."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        raise NotImplementedError


class TopicPartition(NamedTuple):
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class Record:
    """One record read from the log."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers = ()
    timestamp_ms: int = 0

    @property
    def position(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    def with_value(self, value: bytes | None) -> Record:
        """This record with another value (re-framed, or a fact of a fact batch)."""
        return Record(
            self.topic,
            self.partition,
            self.offset,
            self.key,
            value,
            self.headers,
            self.timestamp_ms,
        )


class ValueBatch(NamedTuple):
    """The values of a batch of records read in offset order (None: a tombstone)."""

    values: list[bytes | None]
    next_offset: int  # the offset after the batch's last record


@dataclass(frozen=True, slots=True)
class Outbound:
    """A record to produce. Without an explicit partition the key decides (murmur2)."""

    topic: str
    key: bytes
    value: bytes
    headers: Headers = ()
    partition: int | None = None
    # Produced exactly as it is, never reframed: a forwarded input keeps its sender's bytes.
    verbatim: bool = False


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """A topic: its name, partitions and configuration overrides.

    ``replication`` and ``min_insync_replicas``: what to create it with on Kafka (each
    capped by the brokers there; 0: the broker's defaults), and what a described
    Kafka topic has. The embedded log keeps one copy and reports 1 and 1.
    """

    name: str
    partitions: int
    config: Mapping[str, str] = field(default_factory=dict)
    replication: int = 0
    min_insync_replicas: int = 0


PartitionsCallback = Callable[[Sequence[TopicPartition]], None]


class ProcessorSession(Protocol):
    """A consumer-group member with a transactional producer (exactly-once v2).

    ``on_assign``/``on_revoke`` run inside ``poll``. ``commit`` publishes the
    produced records and the consumed offsets atomically, or nothing at all.
    """

    def subscribe(
        self, topics: Sequence[str], on_assign: PartitionsCallback, on_revoke: PartitionsCallback
    ) -> None: ...

    def poll(self, max_records: int, timeout_s: float) -> list[Record]: ...

    def begin(self) -> None: ...

    def produce(self, record: Outbound) -> None: ...

    def commit(self, consumed: Mapping[TopicPartition, int]) -> list[tuple[TopicPartition, int]]:
        """Commit the open transaction; return (partition, offset) of each produced record.

        ``consumed`` maps each input partition to the next offset to read.
        Raises FencedError when another instance took over (nothing is committed).
        """
        ...

    def abort(self) -> None: ...

    def committed_positions(self) -> dict[TopicPartition, int]:
        """The committed next offset of each assigned input partition that has one."""
        ...

    def close(self) -> None: ...


class Producer(Protocol):
    """A plain idempotent producer for clients and workers."""

    def produce(self, record: Outbound) -> None: ...

    def flush(self, timeout_s: float = 30.0) -> None: ...

    def deliver(self, record: Outbound, timeout_s: float = 30.0) -> tuple[TopicPartition, int]:
        """Produce ``record`` (after what was produced before it), wait until it is
        durable, and return where it was written: its partition and offset."""
        ...

    def close(self) -> None: ...


class GroupConsumer(Protocol):
    """An at-least-once consumer-group member (workers, responders)."""

    def poll(self, max_records: int, timeout_s: float) -> list[Record]: ...

    def joined(self) -> bool:
        """Whether this member has taken its place in the group (its first assignment,
        given during a poll): members that join later move partitions away from it."""
        ...

    def hold(self, held: bool) -> None:
        """While held, take part in the group (polls serve its protocol) but return no
        records: nothing is taken that a member joining later would make move."""
        ...

    def commit(self, consumed: Mapping[TopicPartition, int]) -> None:
        """Commit ``consumed`` (next offsets), waiting until it is stored."""
        ...

    def commit_soon(self, consumed: Mapping[TopicPartition, int]) -> None:
        """Commit ``consumed`` without waiting for it to be stored (a failure is logged;
        the next commit covers it, and at worst records are delivered again)."""
        ...

    def close(self) -> None: ...


class Reader(Protocol):
    """Reads committed records of one partition, outside any consumer group."""

    def end_offset(self, tp: TopicPartition) -> int: ...

    def wait_stable(self, tp: TopicPartition, timeout_s: float) -> bool:
        """Wait until no transaction is open on ``tp``; return whether that happened.

        A transaction left open by a crashed writer hides everything committed
        after it from read_committed readers until the broker aborts it. Restore
        waits for this before it trusts that it has read every committed fact.
        """
        ...

    def read(
        self, tp: TopicPartition, start: int, end: int | None = None, batch_size: int = 10_000
    ) -> Iterator[list[Record]]:
        """Yield batches from ``start`` until ``end`` (default: the end when called).

        A reader may start fetching when this is called (Kafka's does), so a caller
        that reads partitions in turn can start the next read before it is done
        with the last one's batches; starting a read ends the previous one.
        """
        ...

    def read_values(
        self, tp: TopicPartition, start: int, end: int | None = None, batch_size: int = 10_000
    ) -> Iterator[ValueBatch]:
        """``read``, yielding only the values of each batch: restore's lean path.

        The iterator may be a generator that takes a new ``batch_size`` by ``send``
        for the batches after the one it yielded (both transports' are): a reader of
        fact batches asks for as many records as make ``batch_size`` facts
        (``transport/fact_batches.py``).
        """
        ...

    def close(self) -> None: ...


class AdminClient(Protocol):
    def create_topics(self, specs: Sequence[TopicSpec]) -> list[str]:
        """Create the missing topics; return the names created."""
        ...

    def describe_topics(self) -> dict[str, TopicSpec]: ...

    def committed_offsets(
        self, group: str, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, int]:
        """The next offset that the sessions of ``group`` committed on each of
        ``partitions`` that has one: what committed transactions recorded, never an open
        or aborted one's."""
        ...

    def close(self) -> None: ...


class Transport(Protocol):
    """Factory for the clients of one log."""

    name: str

    def session(self, group: str, instance_id: str) -> ProcessorSession: ...

    def producer(self) -> Producer: ...

    def consumer(
        self, group: str, topics: Sequence[str], instance_id: str | None = None
    ) -> GroupConsumer:
        """A member of ``group``; with ``instance_id`` a static one: a member that comes
        back with the same id gets its work (records it held, not acknowledged) at once."""
        ...

    def reader(self) -> Reader: ...

    def admin(self) -> AdminClient: ...
