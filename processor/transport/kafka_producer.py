"""The plain idempotent Kafka producer, and the produce call every Kafka producer shares."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from processor.errors import TransportError
from processor.transport.base import Closeable, Outbound, TopicPartition
from processor.transport.kafka_common import (
    DeliveryCallback,
    ErrorReporter,
    outbound_headers,
    translate,
)

__all__ = ["KafkaProducer", "produce_one"]

logger = logging.getLogger(__name__)

#: How long ``produce`` waits for room in librdkafka's local queue before giving up.
_QUEUE_FULL_TIMEOUT_S = 30.0
#: Serve delivery reports every this many records so their queue stays short.
_SERVE_EVERY = 1000


def produce_one(producer: Producer, record: Outbound, on_delivery: DeliveryCallback) -> None:
    """Produce ``record``; wait for queue room (serving callbacks) when it is full.

    Without an explicit partition the producer's ``murmur2_random`` partitioner
    places the record by its key, like Java clients and ``partition_for``.
    """
    deadline: float | None = None
    while True:
        try:
            producer.produce(
                record.topic,
                record.value,
                record.key,
                partition=-1 if record.partition is None else record.partition,
                on_delivery=on_delivery,
                headers=outbound_headers(record.headers),
            )
            return
        except BufferError as exc:
            now = time.monotonic()
            deadline = now + _QUEUE_FULL_TIMEOUT_S if deadline is None else deadline
            if now >= deadline:
                raise translate(f"produce to {record.topic}", exc) from exc
            producer.poll(0.05)
        except KafkaException as exc:
            raise translate(f"produce to {record.topic}", exc) from exc


class KafkaProducer(Closeable):
    """A plain idempotent producer for clients and workers.

    ``flush`` raises ``TransportError`` when records are still undelivered after
    the timeout or when a delivery failed since the previous flush.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self._reporter = ErrorReporter("producer")
        #: What the producer was made with (librdkafka cannot be asked back).
        self.config: Mapping[str, Any] = MappingProxyType(dict(config))
        try:
            self._producer = Producer(config | self._reporter.config())
        except KafkaException as exc:
            raise translate("create producer", exc) from exc
        self._failures: list[str] = []
        self._unserved = 0
        self._closed = False

    def produce(self, record: Outbound) -> None:
        """Queue ``record`` for delivery."""
        if self._closed:
            raise TransportError("producer is closed")
        produce_one(self._producer, record, self._delivered)
        self._unserved += 1
        if self._unserved >= _SERVE_EVERY:
            self._unserved = 0
            self._producer.poll(0)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every queued record is delivered; raise if any is not."""
        try:
            remaining = self._producer.flush(timeout_s)
        except KafkaException as exc:
            raise translate("flush", exc) from exc
        self._unserved = 0
        failures, self._failures = self._failures, []
        if failures:
            raise TransportError(
                f"{len(failures)} record(s) were not delivered, first: {failures[0]}"
            )
        if remaining:
            raise TransportError(f"{remaining} record(s) still undelivered after {timeout_s}s")
        self._reporter.recovered()

    def deliver(self, record: Outbound, timeout_s: float = 30.0) -> tuple[TopicPartition, int]:
        """Produce ``record``, flush, and return the partition and offset its delivery
        report gave."""
        if self._closed:
            raise TransportError("producer is closed")
        reports: list[Message] = []

        def delivered(err: KafkaError | None, msg: Message) -> None:
            self._delivered(err, msg)
            reports.append(msg)

        produce_one(self._producer, record, delivered)
        self.flush(timeout_s)  # raises unless every record, this one too, was delivered
        (report,) = reports
        partition, offset = report.partition(), report.offset()
        if partition is None or offset is None:  # librdkafka gives both once delivered
            raise TransportError(f"no position in the delivery report of {record.topic}")
        return TopicPartition(record.topic, partition), offset

    def close(self) -> None:
        """Flush, then release the producer."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            self._producer.close()

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self._failures.append(f"{msg.topic()}[{msg.partition()}]: {err}")
