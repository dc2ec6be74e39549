"""Reading committed records of one partition at a time, outside any consumer group.

This is replay's and restore's hot path, so it reuses one consumer for every
``read`` (re-assigning it), fetches big chunks, and turns messages into records
in one tight loop.

With ``isolation.level=read_committed`` transaction markers and records of
aborted transactions occupy offsets but are never returned, so a read cannot
count its way to the end: it stops at the first record at or past ``end``, at
the record ``end - 1``, or at librdkafka's partition-EOF event, which fires when
the fetch position reaches the partition's end (the last stable offset for a
read_committed consumer), whatever the last offsets hold.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Message
from confluent_kafka import TopicPartition as KafkaTopicPartition

from processor.errors import TransportError
from processor.transport.base import Closeable, Record, TopicPartition, ValueBatch
from processor.transport.gc_pause import gc_paused
from processor.transport.kafka_common import RECORD_SETTERS, ErrorReporter, kafka_error, translate

__all__ = ["READER_CONFIG", "KafkaReader"]

logger = logging.getLogger(__name__)

#: Consumer settings of a reader: no group membership or commits, committed data only,
#: an EOF event at the end, and large fetches (one partition is read at a time, so
#: the per-partition limit is what bounds a fetch).
READER_CONFIG: dict[str, Any] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "isolation.level": "read_committed",
    "enable.partition.eof": True,
    "auto.offset.reset": "earliest",
    "fetch.max.bytes": 64 * 1024 * 1024,
    "max.partition.fetch.bytes": 16 * 1024 * 1024,
    # Prefetch up to 64 MiB / 500k records, and refill quickly once below that.
    "queued.max.messages.kbytes": 64 * 1024,
    "queued.min.messages": 500_000,
    "fetch.queue.backoff.ms": 10,
    # A re-assign waits for the in-flight fetch; at the end of a partition that is a
    # long poll of up to fetch.wait.max.ms, so keep it short.
    "fetch.wait.max.ms": 10,
}

_EOF = KafkaError._PARTITION_EOF
_MISSING = frozenset(
    {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION}
)
_METADATA_TIMEOUT_S = 10.0
#: What ListOffsets answers while a partition's leadership settles (a topic created a
#: moment ago, a broker starting up): worth asking again for a while, not a failure.
_LEADERSHIP_SETTLING = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError._UNKNOWN_PARTITION,  # its leader died: the refreshed metadata finds the next
    }
)
_LEADERSHIP_WAIT_S = 10.0
_LEADERSHIP_PAUSE_S = 0.05
#: A read that receives nothing at all (not even the EOF event) for this long fails.
_STALL_TIMEOUT_S = 60.0
_WAIT_STEP_S = 1.0


class KafkaReader(Closeable):
    """Reads committed records of one partition at a time (a ``Reader``).

    One reader reads one partition at a time: starting a new ``read`` ends the
    previous one (its iterator raises ``TransportError`` if resumed). Use one
    reader from one thread at a time.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self._reporter = ErrorReporter("reader")
        config = config | READER_CONFIG | self._reporter.config()
        config["group.id"] = f"processor-reader-{uuid.uuid4().hex}"  # never joined
        self._config = config
        self._uncommitted: Consumer | None = None
        try:
            self._consumer = Consumer(config)
        except KafkaException as exc:
            raise translate("create reader", exc) from exc
        self._generation = 0
        self._closed = False

    def end_offset(self, tp: TopicPartition) -> int:
        """The end a read_committed reader reaches: the last stable offset of ``tp``."""
        self._require_open()
        return self._watermark(self._consumer, tp, "end offset")

    def _watermark(self, consumer: Consumer, tp: TopicPartition, what: str) -> int:
        """The high watermark ``consumer`` sees (its isolation level decides which),
        asking again while the broker is still taking leadership of the partition.

        librdkafka keeps the leader it last knew of a partition it only queries (never
        assigned) and does not look it up again when that broker is gone: every later
        query times out, then fails "unknown partition", until the old leader returns.
        So a failed query refreshes the topic's metadata before the next one (or the
        caller's retry), which then goes to the partition's new leader.
        """
        deadline = time.monotonic() + _LEADERSHIP_WAIT_S
        while True:
            try:
                _low, high = consumer.get_watermark_offsets(
                    KafkaTopicPartition(tp.topic, tp.partition), timeout=_METADATA_TIMEOUT_S
                )
                break
            except KafkaException as exc:
                _refresh_metadata(consumer, tp.topic)
                err = kafka_error(exc)
                settling = err is not None and err.code() in _LEADERSHIP_SETTLING
                if not settling or time.monotonic() >= deadline:
                    raise translate(f"{what} of {tp.topic}[{tp.partition}]", exc) from exc
            time.sleep(_LEADERSHIP_PAUSE_S)  # the broker is taking leadership; ask again
        if high < 0:
            raise TransportError(f"{what} of {tp.topic}[{tp.partition}] unknown")
        return int(high)

    def wait_stable(self, tp: TopicPartition, timeout_s: float) -> bool:
        """Wait until the last stable offset reaches the high watermark seen now."""
        self._require_open()
        high = self._high_watermark(tp)
        deadline = time.monotonic() + timeout_s
        pause = 0.05
        while self.end_offset(tp) < high:
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)  # an open transaction: the broker aborts it at its timeout
            pause = min(pause * 2, 1.0)
        return True

    def _high_watermark(self, tp: TopicPartition) -> int:
        """The high watermark (read_uncommitted view), including open transactions."""
        if self._uncommitted is None:
            config = dict(self._config)
            config["isolation.level"] = "read_uncommitted"
            try:
                self._uncommitted = Consumer(config)
            except KafkaException as exc:
                raise translate("create watermark reader", exc) from exc
        return self._watermark(self._uncommitted, tp, "high watermark")

    def read(
        self, tp: TopicPartition, start: int, end: int | None = None, batch_size: int = 10_000
    ) -> Iterator[list[Record]]:
        """Yield non-empty batches of committed records in ``[start, end)`` in offset order.

        ``end`` defaults to the end of the partition (its last stable offset) when
        ``read`` is called. Fetching starts when ``read`` is called.
        """
        return self._read(tp, start, end, batch_size, self._convert)

    def read_values(
        self, tp: TopicPartition, start: int, end: int | None = None, batch_size: int = 10_000
    ) -> Iterator[ValueBatch]:
        """``read``, yielding only the values of each batch (restore's lean path)."""
        return self._read(tp, start, end, batch_size, self._convert_values)

    def _read(
        self,
        tp: TopicPartition,
        start: int,
        end: int | None,
        batch_size: int,
        convert: _Converter[B],
    ) -> Iterator[B]:
        if start < 0 or batch_size < 1:
            raise ValueError(
                f"read needs start >= 0 and batch_size >= 1, got {start}, {batch_size}"
            )
        self._require_open()
        stop = self.end_offset(tp) if end is None else end
        self._generation += 1
        if start >= stop:
            return iter(())
        # Fetching starts now, not at the first batch asked for: a caller can start
        # the next partition's read while it still writes out the last one's.
        try:
            self._consumer.assign([KafkaTopicPartition(tp.topic, tp.partition, start)])
        except KafkaException as exc:
            raise translate(f"read {tp.topic}[{tp.partition}]", exc) from exc
        return self._batches(tp, stop, batch_size, generation=self._generation, convert=convert)

    def close(self) -> None:
        """Close the consumer."""
        if self._closed:
            return
        self._closed = True
        self._generation += 1
        for consumer in (self._consumer, self._uncommitted):
            if consumer is None:
                continue
            try:
                consumer.close()
            except (KafkaException, RuntimeError) as exc:
                logger.warning("reader: close failed: %s", exc)

    def _batches(
        self,
        tp: TopicPartition,
        stop: int,
        batch_size: int,
        *,
        generation: int,
        convert: _Converter[B],
    ) -> Generator[B, int | None, None]:
        try:
            while True:
                if self._generation != generation:
                    raise TransportError(f"read of {tp.topic}[{tp.partition}] was superseded")
                batch, done = self._next(tp, stop, batch_size, convert)
                if batch is not None:
                    asked = yield batch
                    if asked:  # a new batch size (Reader.read_values)
                        batch_size = asked
                if done:
                    return
        finally:
            if self._generation == generation and not self._closed:
                self._unassign()

    def _unassign(self) -> None:
        """Stop prefetching what nobody will read."""
        try:
            self._consumer.unassign()
        except KafkaException as exc:
            logger.warning("reader: unassign failed: %s", exc)

    def _next(
        self, tp: TopicPartition, stop: int, batch_size: int, convert: _Converter[B]
    ) -> tuple[B | None, bool]:
        """The next batch: what is queued (up to ``batch_size``), else the first message
        or event to arrive and what is queued after it; and whether the read is done.

        ``consume(n, timeout)`` waits for all ``n`` messages even after the EOF event,
        so it drains without waiting, and only ``poll`` blocks (with the collector
        running). The collector is paused from the consume until its messages are
        freed again: collections their allocation would trigger meanwhile walk tens
        of thousands of them, and they hold no reference cycles.
        """
        try:
            converted = self._drain(None, tp, stop, batch_size, convert)
            while converted is None:  # nothing queued: wait for the first to arrive
                converted = self._drain(self._first(tp), tp, stop, batch_size, convert)
            return converted
        except KafkaException as exc:
            raise translate(f"read {tp.topic}[{tp.partition}]", exc) from exc

    def _drain(
        self,
        first: Message | None,
        tp: TopicPartition,
        stop: int,
        batch_size: int,
        convert: _Converter[B],
    ) -> tuple[B | None, bool] | None:
        """``first`` (if given) and what is queued after it, up to ``batch_size`` in all,
        converted with the collector paused until those messages are freed (the list is
        built here, so nothing else holds it); None if there were none."""
        with gc_paused():
            messages = [] if first is None else [first]
            if len(messages) < batch_size:
                messages += self._consumer.consume(batch_size - len(messages), 0)
            converted = convert(messages, tp, stop) if messages else None
            del messages
        return converted

    def _first(self, tp: TopicPartition) -> Message:
        """The first message or event to arrive (waiting up to the stall timeout)."""
        deadline = time.monotonic() + _STALL_TIMEOUT_S
        while (first := self._consumer.poll(_WAIT_STEP_S)) is None:
            if time.monotonic() >= deadline:
                raise TransportError(
                    f"read {tp.topic}[{tp.partition}]: nothing received for {_STALL_TIMEOUT_S:.0f}s"
                )
        return first

    def _convert(
        self, messages: list[Message], tp: TopicPartition, stop: int
    ) -> tuple[list[Record] | None, bool]:
        """Records of ``messages`` before ``stop``, and whether the read is complete.

        The hot loop of replay. ``Record`` is a frozen dataclass whose generated
        ``__init__`` costs several times the rest of the loop, so records are
        built the way that ``__init__`` builds them, minus its overhead: a bare
        instance whose slots are filled through their descriptors (see
        ``RECORD_SETTERS``).
        """
        topic, partition = tp
        new, cls = object.__new__, Record
        setters = RECORD_SETTERS
        set_topic, set_partition, set_offset = (
            setters["topic"],
            setters["partition"],
            setters["offset"],
        )
        set_key, set_value, set_headers, set_timestamp = (
            setters["key"],
            setters["value"],
            setters["headers"],
            setters["timestamp_ms"],
        )
        records: list[Record] = []
        append = records.append
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() == _EOF:
                    return records or None, True
                self._failed(tp, err)
                continue
            offset = msg.offset()
            if offset >= stop:  # type: ignore[operator]
                return records or None, True
            headers = msg.headers()
            timestamp = msg.timestamp()[1]
            record = new(cls)
            set_topic(record, topic)
            set_partition(record, partition)
            set_offset(record, offset)
            set_key(record, msg.key())
            set_value(record, msg.value())
            set_headers(record, tuple(headers) if headers else ())
            set_timestamp(record, timestamp if timestamp > 0 else 0)
            append(record)
        return records or None, bool(records) and records[-1].offset >= stop - 1

    def _convert_values(
        self, messages: list[Message], tp: TopicPartition, stop: int
    ) -> tuple[ValueBatch | None, bool]:
        """``_convert``, keeping only the values (and the offset after the last one)."""
        values: list[bytes | None] = []
        append = values.append
        last = -1
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() == _EOF:
                    return _value_batch(values, last), True
                self._failed(tp, err)
                continue
            offset: int = msg.offset()  # type: ignore[assignment]
            if offset >= stop:
                return _value_batch(values, last), True
            append(msg.value())
            last = offset
        return _value_batch(values, last), last >= stop - 1

    def _failed(self, tp: TopicPartition, err: KafkaError) -> None:
        """A fetch error: raise when the partition is gone or the client is dead, else log."""
        if err.fatal() or err.code() in _MISSING:
            raise TransportError(f"read {tp.topic}[{tp.partition}]: {err}")
        self._reporter(err)

    def _require_open(self) -> None:
        if self._closed:
            raise TransportError("reader is closed")


B = TypeVar("B", list[Record], ValueBatch)
#: Turns fetched messages into a batch (None: nothing to yield) and says if the read is done.
_Converter = Callable[[list[Message], TopicPartition, int], tuple[B | None, bool]]


def _refresh_metadata(consumer: Consumer, topic: str) -> None:
    """Ask the cluster who leads ``topic``'s partitions now (best effort: a cluster that
    cannot answer leaves the next query to fail as it would have)."""
    try:
        consumer.list_topics(topic, timeout=_METADATA_TIMEOUT_S)
    except KafkaException as exc:
        logger.debug("metadata of %s not refreshed: %s", topic, exc)


def _value_batch(values: list[bytes | None], last: int) -> ValueBatch | None:
    return ValueBatch(values, last + 1) if values else None
