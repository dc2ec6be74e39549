"""Paged reads for operators: a run's history, pending requests, and topic pages.

Each read returns one page and where the next one starts, and reads no more than
that page needs: ``history_page`` decodes the facts of its page (and a handful to
find where it starts), ``read_topic_page`` asks the log for at most ``limit``
records, never the whole topic.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from processor.clients.client import fact_dict
from processor.clients.dead_letters import dead_letter_dict
from processor.clients.pending import PendingRequest, pending_requests
from processor.clients.rejected import rejected_dict
from processor.clients.topic_cursor import CursorError, decode_cursor, encode_cursor
from processor.errors import FactDecodeError
from processor.facts.codec import codec, decode_fact
from processor.facts.models import DeadLetter, Rejected
from processor.transport.base import Reader, Record, TopicPartition, Transport

__all__ = [
    "MAX_PAGE",
    "CursorError",
    "HistoryPage",
    "PendingRequest",
    "TopicPage",
    "history_page",
    "pending_requests",
    "read_topic_page",
    "record_dict",
]

logger = logging.getLogger(__name__)

#: The largest page any paged read returns (the API's and the CLI's limit too).
MAX_PAGE = 1000

RecordShape = Callable[[bytes | None], dict[str, Any]]


def _check_limit(limit: int) -> None:
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be 1 to {MAX_PAGE}, got {limit}")


# --- a run's history ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HistoryPage:
    """Facts of one run in sequence order, and the seq to give as ``after`` next (None: no more)."""

    facts: list[dict[str, Any]]
    next_after: int | None

    def as_dict(self) -> dict[str, Any]:
        return {"facts": self.facts, "next_after": self.next_after}


def history_page(facts: list[bytes], after: int, limit: int) -> HistoryPage:
    """The facts of a run's encoded history with seq greater than ``after``, at most ``limit``.

    Raises:
        ValueError: ``after`` is negative or ``limit`` is not 1 to 1,000.
    """
    _check_limit(limit)
    if after < 0:
        raise ValueError(f"after must be a fact seq >= 0, got {after}")
    # A history is in seq order: a binary search decodes a few facts, not all before the page.
    start = bisect.bisect_right(facts, after, key=lambda raw: decode_fact(raw).seq)
    page = [fact_dict(decode_fact(raw)) for raw in facts[start : start + limit]]
    more = start + limit < len(facts)
    return HistoryPage(page, page[-1]["seq"] if more else None)


# --- pages of a topic ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopicPage:
    """Records of a topic, partition by partition in offset order, and the next page's cursor."""

    records: list[dict[str, Any]]
    next_cursor: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"records": self.records, "next_cursor": self.next_cursor}


def record_dict(value: bytes | None) -> dict[str, Any]:
    """A record of admission.rejected or runs.dlq in its operator shape."""
    try:
        model = type(codec().decode(value))
    except FactDecodeError:
        model = Rejected  # what cannot be decoded is shown as rejected_dict shows it
    return dead_letter_dict(value) if model is DeadLetter else rejected_dict(value)


def read_topic_page(
    transport: Transport,
    topic: str,
    cursor: str | None,
    limit: int,
    *,
    partitions: int | None = None,
    shape: RecordShape = record_dict,
) -> TopicPage:
    """Up to ``limit`` records of ``topic`` from ``cursor`` (None: the start); a few
    more where ``limit`` would end a page inside a fact batch's facts (``_take``).

    ``partitions`` saves asking the log how many the topic has. A topic that does
    not exist is an empty page.

    Raises:
        ValueError: ``limit`` is not 1 to 1,000.
        CursorError: ``cursor`` is not a cursor of ``topic``.
    """
    _check_limit(limit)
    offsets = decode_cursor(cursor, topic)
    count = partitions if partitions is not None else _partition_count(transport, topic)
    if count is None:
        return TopicPage([], None)
    reader = transport.reader()
    try:
        records, full = _fill(reader, topic, count, offsets, limit)
    finally:
        reader.close()
    shown = [shape(r.value) for r in records]
    return TopicPage(shown, encode_cursor(topic, offsets) if full else None)


def _partition_count(transport: Transport, topic: str) -> int | None:
    admin = transport.admin()
    try:
        spec = admin.describe_topics().get(topic)
    finally:
        admin.close()
    return None if spec is None else spec.partitions


def _fill(
    reader: Reader, topic: str, partitions: int, offsets: dict[int, int], limit: int
) -> tuple[list[Record], bool]:
    """Read partitions in turn from ``offsets`` until ``limit`` records; advance ``offsets``.

    Returns the records and whether the page filled up (then more may follow).
    """
    records: list[Record] = []
    for partition in range(partitions):
        tp = TopicPartition(topic, partition)
        start, end = offsets.get(partition, 0), reader.end_offset(tp)
        if start >= end:
            continue
        taken = _take(
            reader.read(tp, start, end, batch_size=limit - len(records)), limit - len(records)
        )
        records += taken
        if len(records) >= limit:
            offsets[partition] = taken[-1].offset + 1
            return records, True
        # Read to the end: offsets below it held no more committed records.
        offsets[partition] = end
    return records, False


def _take(batches: Iterator[list[Record]], wanted: int) -> list[Record]:
    """``wanted`` records from ``batches``, then stop the read (no more is fetched).

    Facts read from one record (a fact batch, ``transport/fact_batches.py``) share its
    offset and are taken together, so a page may hold a few more than ``wanted``: a
    cursor is an offset, and the next page starts after the whole record.
    """
    taken: list[Record] = []
    try:
        for batch in batches:
            cut = wanted - len(taken)
            while 0 < cut < len(batch) and batch[cut].offset == batch[cut - 1].offset:
                cut += 1
            taken += batch[:cut]
            if len(taken) >= wanted:
                break
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()  # ends the read now, not when the iterator is collected
    return taken
