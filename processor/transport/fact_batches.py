"""Readers that hand out the facts of a ``FactBatch`` record one by one.

Every reader a transport makes is one of these, so whatever reads runs.facts
(restore, replay, clients, pages) sees single facts whether or not they were
written in batches (``facts/fact_batch.py``): each fact of a batch is handed out
with the record's key, offset, headers and timestamp, in the batch's order. A read
resumes after a record, never inside one.

Only the journal is expanded: a topic whose name ends in ``runs.facts`` (the name
under any ``PROCESSOR_TOPIC_PREFIX``). Any other topic reads as it was written, even
a record that happens to begin like a batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

from processor.facts.fact_batch import batch_header, unpack
from processor.facts.topics import TopicName
from processor.transport.base import Closeable, Reader, Record, TopicPartition, ValueBatch

__all__ = ["FactBatchReader", "expand_records", "expand_values", "is_journal"]

B = TypeVar("B")


class FactBatchReader(Closeable):
    """``inner``, with each ``FactBatch`` record read as the facts it holds."""

    def __init__(self, inner: Reader) -> None:
        self.inner = inner

    def end_offset(self, tp: TopicPartition) -> int:
        return self.inner.end_offset(tp)

    def wait_stable(self, tp: TopicPartition, timeout_s: float) -> bool:
        return self.inner.wait_stable(tp, timeout_s)

    def read(
        self, tp: TopicPartition, start: int, end: int | None = None, batch_size: int = 10_000
    ) -> Iterator[list[Record]]:
        # The inner read starts now, as the protocol allows (its first fetch in flight).
        batches = self.inner.read(tp, start, end, batch_size)
        return _expanded(batches, expand_records) if is_journal(tp.topic) else batches

    def read_values(
        self, tp: TopicPartition, start: int, end: int | None = None, batch_size: int = 10_000
    ) -> Iterator[ValueBatch]:
        batches = self.inner.read_values(tp, start, end, batch_size)
        return _expanded(batches, expand_values) if is_journal(tp.topic) else batches

    def close(self) -> None:
        self.inner.close()


def is_journal(topic: str) -> bool:
    """Whether ``topic`` is a deployment's runs.facts (under its prefix)."""
    return topic.endswith(TopicName.FACTS.value)


def _expanded(batches: Iterator[B], expand: Callable[[B], B]) -> Iterator[B]:
    try:
        for batch in batches:
            yield expand(batch)
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()  # a read stopped early ends the inner one now


def expand_records(batch: list[Record]) -> list[Record]:
    """``batch`` with each ``FactBatch`` record replaced by its facts (``batch`` itself
    when it holds none)."""
    header = batch_header()
    first = next(
        (i for i, r in enumerate(batch) if r.value is not None and r.value.startswith(header)),
        None,
    )
    if first is None:
        return batch
    out = batch[:first]
    for record in batch[first:]:
        value = record.value
        if value is None or not value.startswith(header):
            out.append(record)
            continue
        out.extend(
            Record(
                record.topic,
                record.partition,
                record.offset,
                record.key,
                fact,
                record.headers,
                record.timestamp_ms,
            )
            for fact in unpack(value)
        )
    return out


def expand_values(batch: ValueBatch) -> ValueBatch:
    """``batch`` with each ``FactBatch`` value replaced by its facts' values."""
    header = batch_header()
    values = batch.values
    first = next((i for i, v in enumerate(values) if v is not None and v.startswith(header)), None)
    if first is None:
        return batch
    out = values[:first]
    for value in values[first:]:
        if value is not None and value.startswith(header):
            out += unpack(value)
        else:
            out.append(value)
    return ValueBatch(out, batch.next_offset)
