"""Readers that hand out the facts of a ``FactBatch`` record one by one.

Every reader a transport makes is one of these (the registry's expands the same way
around its framing, ``transport/registry.py``), so whatever reads runs.facts
(restore, replay, clients, pages) sees single facts whether or not they were
written in batches (``facts/fact_batch.py``): each fact of a batch is handed out
with the record's key, offset, headers and timestamp, in the batch's order. A read
resumes after a record, never inside one.

Only the journal is expanded: a topic whose name ends in ``runs.facts`` (the name
under any ``PROCESSOR_TOPIC_PREFIX``). Any other topic reads as it was written, even
a record that happens to begin like a batch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from functools import cache
from typing import TypeVar

from processor.facts.fact_batch import batch_header, unpack
from processor.facts.topics import TopicName
from processor.transport.base import Closeable, Reader, Record, TopicPartition, ValueBatch

__all__ = [
    "FactBatchReader",
    "expand_records",
    "expand_values",
    "first_batch_size",
    "is_journal",
    "journal_values",
]

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
        if is_journal(tp.topic):
            return journal_values(self.inner, tp, start, end, batch_size, expand=expand_values)
        return self.inner.read_values(tp, start, end, batch_size)

    def close(self) -> None:
        self.inner.close()


def is_journal(topic: str) -> bool:
    """Whether ``topic`` is a deployment's runs.facts (under its prefix)."""
    return topic.endswith(TopicName.FACTS.value)


#: The records the first read of a journal asks for (at most): enough to learn how many
#: facts a record holds before asking for more, few enough to cost nothing otherwise.
_PROBE_RECORDS = 64


def journal_values(
    inner: Reader,
    tp: TopicPartition,
    start: int,
    end: int | None,
    batch_size: int,
    *,
    expand: Callable[[ValueBatch], ValueBatch],
) -> Iterator[ValueBatch]:
    """``inner``'s value batches of the journal ``tp``, each through ``expand``, of about
    ``batch_size`` facts rather than records.

    A record of a journal written with fact batches holds several facts, so a batch of
    ``batch_size`` records would hold several times the facts a restore means to fold
    at once (and the memory it takes). After each batch the inner read is asked for as
    many records as made ``batch_size`` facts in it (``Reader.read_values``).
    """
    first = first_batch_size(batch_size)
    return _sized(inner.read_values(tp, start, end, first), batch_size, expand)


def first_batch_size(batch_size: int) -> int:
    """How many records the first read of a journal asks for (``journal_values``)."""
    return min(batch_size, _PROBE_RECORDS)


def _sized(
    batches: Iterator[ValueBatch], batch_size: int, expand: Callable[[ValueBatch], ValueBatch]
) -> Iterator[ValueBatch]:
    send = getattr(batches, "send", None)
    try:
        batch = next(batches)
        while True:
            records = len(batch.values)
            expanded = expand(batch)
            yield expanded
            asked = max(1, batch_size * records // max(1, len(expanded.values)))
            batch = send(asked) if send is not None else next(batches)
    except StopIteration:
        return
    finally:
        _end_read(batches)


def _expanded(batches: Iterator[B], expand: Callable[[B], B]) -> Iterator[B]:
    try:
        for batch in batches:
            yield expand(batch)
    finally:
        _end_read(batches)


def _end_read(batches: Iterator[object]) -> None:
    """End the inner read now when this one stopped early (not when it is collected)."""
    close = getattr(batches, "close", None)
    if close is not None:
        close()


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
        out.extend(record.with_value(fact) for fact in unpack(value))
    return out


def expand_values(batch: ValueBatch) -> ValueBatch:
    """``batch`` with each ``FactBatch`` value replaced by its facts' values.

    Restore and replay read every fact this way: with the compiled extension installed
    it scans and splits in Rust (``processor_native.expand_fact_batches``), which a
    journal of batches needs to replay as fast as one of single facts.
    """
    native = _native_expand()
    if native is not None:
        try:
            values = native(batch.values, batch_header())
        except ValueError:
            pass  # a batch that does not decode: the Python path below says why
        else:
            return batch if values is None else ValueBatch(values, batch.next_offset)
    return _expand_values(batch)


@cache
def _native_expand() -> Callable[[list[bytes | None], bytes], list[bytes | None] | None] | None:
    """The compiled split, when an extension that has it is installed."""
    try:
        extension = importlib.import_module("processor_native")
    except ImportError:
        return None
    found: Callable[[list[bytes | None], bytes], list[bytes | None] | None] | None
    found = getattr(extension, "expand_fact_batches", None)  # an older build has none
    return found


def _expand_values(batch: ValueBatch) -> ValueBatch:
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
