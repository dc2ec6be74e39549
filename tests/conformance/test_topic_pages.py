"""Pages of a topic on both transports: each record once, in order, reading only a page."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from processor.clients.pages import CursorError, TopicPage, read_topic_page
from processor.transport.base import Outbound, Reader, Record, TopicPartition, Transport
from tests.conformance.conftest import TopicFactory


@dataclass
class _Asked:
    """What a page asked the log for: each read's batch size, and the records it got."""

    batch_sizes: list[int] = field(default_factory=list)
    records: int = 0


class _RecordingReader:
    def __init__(self, reader: Reader, asked: _Asked) -> None:
        self._reader, self._asked = reader, asked

    def end_offset(self, tp: TopicPartition) -> int:
        return self._reader.end_offset(tp)

    def read(
        self, tp: TopicPartition, start: int, end: int | None = None, batch_size: int = 10_000
    ) -> Iterator[list[Record]]:
        self._asked.batch_sizes.append(batch_size)
        batches = self._reader.read(tp, start, end, batch_size)
        try:
            for batch in batches:
                self._asked.records += len(batch)
                yield batch
        finally:
            getattr(batches, "close", lambda: None)()

    def close(self) -> None:
        self._reader.close()


class _RecordingTransport:
    """A transport whose readers record what they are asked for."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        self.pages: list[_Asked] = []

    def reader(self) -> Any:
        self.pages.append(_Asked())
        return _RecordingReader(self._transport.reader(), self.pages[-1])

    def admin(self) -> Any:
        return self._transport.admin()


def _produce(transport: Transport, topic: str, values: list[tuple[int, bytes]]) -> None:
    producer = transport.producer()
    try:
        for partition, value in values:
            producer.produce(Outbound(topic, b"k", value, partition=partition))
        producer.flush()
    finally:
        producer.close()


def _shape(value: bytes | None) -> dict[str, Any]:
    return {"value": (value or b"").decode()}


def _page(transport: Any, topic: str, cursor: str | None, limit: int) -> TopicPage:
    return read_topic_page(transport, topic, cursor, limit, shape=_shape)


def test_pages_of_three_give_every_record_once_in_partition_order(
    transport: Transport, make_topic: TopicFactory
) -> None:
    topic = make_topic(partitions=3)
    sent = [(i % 3, f"r{i}".encode()) for i in range(11)]
    _produce(transport, topic, sent)
    recording = _RecordingTransport(transport)

    pages: list[list[str]] = []
    cursor: str | None = None
    while True:
        page = _page(recording, topic, cursor, 3)
        pages.append([r["value"] for r in page.records])
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
        assert len(pages) < 10, "paging never ended"

    expected = [f"r{i}" for p in range(3) for i in range(11) if i % 3 == p]
    assert [v for page in pages for v in page] == expected
    assert all(len(page) == 3 for page in pages[:-1])
    for asked in recording.pages:  # a page asks for no more than it still needs
        assert asked.records <= 3
        assert all(1 <= size <= 3 for size in asked.batch_sizes)


def test_a_cursor_is_stable_while_records_are_added(
    transport: Transport, make_topic: TopicFactory
) -> None:
    topic = make_topic(partitions=2)
    _produce(transport, topic, [(0, b"a0"), (0, b"a1"), (1, b"b0"), (1, b"b1")])
    first = _page(transport, topic, None, 3)
    assert [r["value"] for r in first.records] == ["a0", "a1", "b0"]
    assert first.next_cursor is not None
    # Appended after the cursor was made, behind it (partition 0) and ahead of it: the
    # next page reads both, and nothing the first page read comes again.
    _produce(transport, topic, [(0, b"a2"), (1, b"b2")])
    again = _page(transport, topic, first.next_cursor, 3)
    assert [r["value"] for r in again.records] == ["a2", "b1", "b2"]
    assert again.next_cursor is not None  # a full page: more may follow
    assert _page(transport, topic, again.next_cursor, 3).records == []
    # The same cursor gives the same page whenever it is used.
    assert _page(transport, topic, first.next_cursor, 3).records == again.records


def test_a_bad_cursor_and_a_bad_limit_are_refused(
    transport: Transport, make_topic: TopicFactory
) -> None:
    topic, other = make_topic(partitions=1), make_topic(partitions=1)
    _produce(transport, topic, [(0, b"x"), (0, b"y")])
    with pytest.raises(CursorError, match="cursor: not a page cursor"):
        _page(transport, topic, "garbage", 3)
    foreign = _page(transport, topic, None, 1).next_cursor
    with pytest.raises(CursorError, match="another topic"):
        _page(transport, other, foreign, 3)
    for limit in (0, 1001):
        with pytest.raises(ValueError, match="limit"):
            _page(transport, topic, None, limit)


def test_a_topic_that_does_not_exist_is_an_empty_page(transport: Transport) -> None:
    page = _page(transport, "no.such.topic.a1b2c3", None, 10)
    assert (page.records, page.next_cursor) == ([], None)
