"""The Confluent wire format at the transport edge: a wrapper around the Kafka transport.

With ``PROCESSOR_SCHEMA_REGISTRY_URL`` set, every record of ours leaves in the
Confluent framing (``00`` + schema id + the same Avro body), its schema
registered under ``<topic>-<record full name>``; a record produced ``verbatim``
(an input forwarded to its run's partition) keeps its sender's bytes. On the way in:

- records polled by sessions and group consumers keep their bytes (a refused
  one goes to admission.rejected exactly as it was read); their schema ids are
  bound in the codec first, which then decodes both framings;
- records read by readers (restore, replay, clients) are handed up in the
  single-object form, which the stores keep.

A fact batch of runs.facts (``facts/fact_batch.py``) leaves with each of its facts
in the Confluent framing as well, so a reader with nothing but the registry decodes
the batch and then each fact; readers here expand it into single-object facts.

Single-object values stay readable, so a deployment can switch either way
without rewriting its topics. Records a poll returned while the registry was
unreachable are kept and handed out by the next poll, so none is lost.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from processor.facts.fact_batch import batch_of, is_batch, unpack
from processor.transport.base import (
    AdminClient,
    Closeable,
    GroupConsumer,
    Outbound,
    PartitionsCallback,
    ProcessorSession,
    Producer,
    Reader,
    Record,
    TopicPartition,
    Transport,
    ValueBatch,
)
from processor.transport.fact_batches import (
    FactBatchReader,
    expand_records,
    expand_values,
    is_journal,
    journal_values,
)
from processor.transport.schema_ids import SchemaIds

__all__ = ["RegistryTransport"]


class RegistryTransport:
    """``inner``'s clients, speaking the Confluent wire format through ``ids``."""

    def __init__(self, inner: Transport, ids: SchemaIds) -> None:
        self.inner = inner
        self.ids = ids
        self.name = inner.name

    def session(self, group: str, instance_id: str) -> ProcessorSession:
        return _Session(self.inner.session(group, instance_id), self.ids)

    def producer(self) -> Producer:
        return _Producer(self.inner.producer(), self.ids)

    def consumer(
        self, group: str, topics: Sequence[str], instance_id: str | None = None
    ) -> GroupConsumer:
        return _Consumer(self.inner.consumer(group, topics, instance_id), self.ids)

    def reader(self) -> Reader:
        return _Reader(self.inner.reader(), self.ids)

    def admin(self) -> AdminClient:
        return self.inner.admin()


def _framed(record: Outbound, ids: SchemaIds) -> Outbound:
    if record.verbatim:
        return record
    value = record.value
    if is_journal(record.topic) and is_batch(value):
        # Each fact in the Confluent framing too: a reader with the registry alone
        # decodes the batch, then each of its facts.
        value = batch_of([ids.confluent(record.topic, fact) for fact in unpack(value)])
    value = ids.confluent(record.topic, value)
    if value is record.value:
        return record
    return Outbound(record.topic, record.key, value, record.headers, record.partition)


class _Polled:
    """Binds the schema ids of polled records; keeps them if the registry fails."""

    def __init__(self, ids: SchemaIds) -> None:
        self._ids = ids
        self._kept: list[Record] = []

    def bound(self, records: list[Record]) -> list[Record]:
        self._kept = records
        for record in records:
            self._ids.bind(record.value)  # raises RegistryUnavailableError
        self._kept = []
        return records

    def take_kept(self) -> list[Record]:
        kept, self._kept = self._kept, []
        return kept


class _Session(Closeable):
    def __init__(self, inner: ProcessorSession, ids: SchemaIds) -> None:
        self._inner = inner
        self._ids = ids
        self._polled = _Polled(ids)

    def subscribe(
        self, topics: Sequence[str], on_assign: PartitionsCallback, on_revoke: PartitionsCallback
    ) -> None:
        self._inner.subscribe(topics, on_assign, on_revoke)

    def poll(self, max_records: int, timeout_s: float) -> list[Record]:
        kept = self._polled.take_kept()
        return self._polled.bound(kept or self._inner.poll(max_records, timeout_s))

    def begin(self) -> None:
        self._inner.begin()

    def produce(self, record: Outbound) -> None:
        self._inner.produce(_framed(record, self._ids))

    def commit(self, consumed: Mapping[TopicPartition, int]) -> list[tuple[TopicPartition, int]]:
        return self._inner.commit(consumed)

    def abort(self) -> None:
        self._inner.abort()

    def committed_positions(self) -> dict[TopicPartition, int]:
        return self._inner.committed_positions()

    def close(self) -> None:
        self._inner.close()


class _Producer(Closeable):
    def __init__(self, inner: Producer, ids: SchemaIds) -> None:
        self._inner = inner
        self._ids = ids

    def produce(self, record: Outbound) -> None:
        self._inner.produce(_framed(record, self._ids))

    def flush(self, timeout_s: float = 30.0) -> None:
        self._inner.flush(timeout_s)

    def deliver(self, record: Outbound, timeout_s: float = 30.0) -> tuple[TopicPartition, int]:
        return self._inner.deliver(_framed(record, self._ids), timeout_s)

    def close(self) -> None:
        self._inner.close()


class _Consumer(Closeable):
    def __init__(self, inner: GroupConsumer, ids: SchemaIds) -> None:
        self._inner = inner
        self._polled = _Polled(ids)

    def poll(self, max_records: int, timeout_s: float) -> list[Record]:
        kept = self._polled.take_kept()
        return self._polled.bound(kept or self._inner.poll(max_records, timeout_s))

    def joined(self) -> bool:
        return self._inner.joined()

    def hold(self, held: bool) -> None:
        self._inner.hold(held)

    def commit(self, consumed: Mapping[TopicPartition, int]) -> None:
        self._inner.commit(consumed)

    def commit_soon(self, consumed: Mapping[TopicPartition, int]) -> None:
        self._inner.commit_soon(consumed)

    def close(self) -> None:
        self._inner.close()


class _Reader(Closeable):
    def __init__(self, inner: Reader, ids: SchemaIds) -> None:
        self._inner = inner
        self._ids = ids

    def end_offset(self, tp: TopicPartition) -> int:
        return self._inner.end_offset(tp)

    def wait_stable(self, tp: TopicPartition, timeout_s: float) -> bool:
        return self._inner.wait_stable(tp, timeout_s)

    def read(
        self, tp: TopicPartition, start: int, end: int | None = None, batch_size: int = 10_000
    ) -> Iterator[list[Record]]:
        journal = is_journal(tp.topic)
        for read in self._inner.read(tp, start, end, batch_size):
            self._single_object(read)
            if not journal:
                yield read
                continue
            expanded = expand_records(read)  # a batch's facts: in the Confluent framing too
            self._single_object(expanded)
            yield expanded

    def _single_object(self, batch: list[Record]) -> None:
        single_object = self._ids.single_object
        for index, record in enumerate(batch):
            value = single_object(record.value)
            if value is not record.value:
                batch[index] = record.with_value(value)

    def read_values(
        self, tp: TopicPartition, start: int, end: int | None = None, batch_size: int = 10_000
    ) -> Iterator[ValueBatch]:
        if is_journal(tp.topic):
            # Batches of about batch_size facts, each fact framed as single-object.
            raw = self._inner.inner if isinstance(self._inner, FactBatchReader) else self._inner
            return journal_values(raw, tp, start, end, batch_size, expand=self._journal_values)
        return self._values(self._inner.read_values(tp, start, end, batch_size))

    def _values(self, batches: Iterator[ValueBatch]) -> Iterator[ValueBatch]:
        for batch in batches:
            self._single_object_values(batch.values)
            yield batch

    def _journal_values(self, batch: ValueBatch) -> ValueBatch:
        self._single_object_values(batch.values)
        expanded = expand_values(batch)  # a batch's facts: in the Confluent framing too
        self._single_object_values(expanded.values)
        return expanded

    def _single_object_values(self, values: list[bytes | None]) -> None:
        single_object = self._ids.single_object
        for index, value in enumerate(values):
            if value and value[0] == 0:
                values[index] = single_object(value)

    def close(self) -> None:
        self._inner.close()


if TYPE_CHECKING:
    # Static proof that the wrapper implements the transport protocols.
    def _conforms(transport: RegistryTransport) -> Transport:
        return transport
