"""The Kafka transport (confluent-kafka): production's log.

Every client gets the base config ``{"bootstrap.servers": ...} | security`` from
the settings. Producers use librdkafka's ``murmur2_random`` partitioner, the Java
client's, so a key lands on ``partition_for(key, n)`` whoever produced it;
all producers are idempotent. Library errors are translated to
``TransportError``/``FencedError`` inside the ``kafka_*`` modules and nowhere else.

Modules: ``kafka_session`` (processor sessions, EOS v2), ``kafka_producer``,
``kafka_consumer`` (worker group members), ``kafka_reader`` (replay and restore),
``kafka_admin`` (topics), ``kafka_common`` (error translation, record conversion).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from processor.config.settings import Settings, kafka_bootstrap, librdkafka_security
from processor.transport.fact_batches import FactBatchReader
from processor.transport.kafka_admin import KafkaAdmin
from processor.transport.kafka_consumer import KafkaGroupConsumer
from processor.transport.kafka_producer import KafkaProducer
from processor.transport.kafka_reader import KafkaReader
from processor.transport.kafka_session import KafkaSession

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
    "KafkaAdmin",
    "KafkaGroupConsumer",
    "KafkaProducer",
    "KafkaReader",
    "KafkaSession",
    "KafkaTransport",
]

logger = logging.getLogger(__name__)

#: Every producer: Java-compatible key placement, idempotence, small batching delay, and
#: a record acknowledged only once every in-sync replica has it (``acks=all``:
#: idempotence implies it, but it is the durability of every commit, so it is said),
#: room for the rejection of any record a broker accepts (its key twice, its value and
#: a reason: admission.rejected takes records this large, other topics keep their limit).
PRODUCER_CONFIG: dict[str, Any] = {
    "partitioner": "murmur2_random",
    "acks": "all",
    "enable.idempotence": True,
    "linger.ms": 5,
    "compression.type": "lz4",
    "message.max.bytes": 4 * 1024 * 1024,
}


#: The transactional producer's first retry backoff (librdkafka's default is 100 ms,
#: doubling up to ``retry.backoff.max.ms``, 1 s). A transaction's ``AddOffsetsToTxn``
#: sent while the coordinator still writes the markers of the one before is refused
#: with CONCURRENT_TRANSACTIONS and retried; at 100 ms, 1-2 % of the commits of a
#: steady flow took 90-120 ms instead of ~3 (BENCHMARKS row 22).
TRANSACTION_RETRY_BACKOFF_MS = 5


class KafkaTransport:
    """Factory for the clients of one Kafka cluster (``PROCESSOR_BROKER=kafka://...``).

    Args:
        settings: broker URL, security settings and the three timeouts below
            (``kafka_*_ms``), which the keyword arguments override.
        session_timeout_ms: how soon a crashed group member loses its partitions.
        max_poll_interval_ms: how soon a member that stopped polling (a zombie) is
            evicted; at least ``session_timeout_ms`` (librdkafka requires it).
        transaction_timeout_ms: how soon the broker aborts a transaction left open by
            a crashed processor; until then it holds back what read_committed readers
            (workers, restores, clients) see of every partition it wrote to.
    """

    name = "kafka"

    def __init__(
        self,
        settings: Settings,
        *,
        session_timeout_ms: int | None = None,
        max_poll_interval_ms: int | None = None,
        transaction_timeout_ms: int | None = None,
    ) -> None:
        self.settings = settings
        if session_timeout_ms is None:
            session_timeout_ms = settings.kafka_session_timeout_ms
        if max_poll_interval_ms is None:
            max_poll_interval_ms = settings.kafka_max_poll_interval_ms
        self._transaction_timeout_ms = (
            settings.kafka_transaction_timeout_ms
            if transaction_timeout_ms is None
            else transaction_timeout_ms
        )
        self._membership: dict[str, Any] = {
            "session.timeout.ms": session_timeout_ms,
            # Three heartbeats a session, as Kafka advises: librdkafka's own 3 s would
            # let a shorter session expire between two of them, again and again.
            "heartbeat.interval.ms": min(3_000, max(1, session_timeout_ms // 3)),
            "max.poll.interval.ms": max(max_poll_interval_ms, session_timeout_ms),
        }
        self._base: dict[str, Any] = {
            "bootstrap.servers": kafka_bootstrap(settings)
        } | librdkafka_security(settings)

    def session(self, group: str, instance_id: str) -> KafkaSession:
        """A processor session: group member of ``group`` plus transactional producer.

        The ``range`` assignor keeps co-partitioning: with equal partition counts
        one member gets the same partition numbers of every subscribed topic.
        The transactional.id is ``f"{group}-{instance_id}"``: a new session with the
        same pair fences the old one.
        """
        consumer = (
            self._base
            | {
                "client.id": f"{group}-{instance_id}",
                "group.id": group,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest",
                "partition.assignment.strategy": "range",
            }
            | self._membership
        )
        producer = (
            self._base
            | PRODUCER_CONFIG
            | {
                "client.id": f"{group}-{instance_id}",
                "transactional.id": f"{group}-{instance_id}",
                "transaction.timeout.ms": self._transaction_timeout_ms,
                "retry.backoff.ms": TRANSACTION_RETRY_BACKOFF_MS,
            }
        )
        return KafkaSession(consumer, producer, dict(self._base), group, instance_id)

    def producer(self) -> KafkaProducer:
        """A plain idempotent producer."""
        return KafkaProducer(self._base | PRODUCER_CONFIG)

    def consumer(
        self, group: str, topics: Sequence[str], instance_id: str | None = None
    ) -> KafkaGroupConsumer:
        """An at-least-once member of ``group`` reading committed records of ``topics``.

        With ``instance_id``, a static member (``group.instance.id``): restarted with
        the same id within the session timeout, it gets its partitions back with no
        rebalance, and reads again from its last committed offsets the records it had
        not finished (the in-process workers of ``processor run``). A static member
        does not leave the group on close: its partitions wait for it (or for the
        session timeout) rather than move.
        """
        static = {} if instance_id is None else {"group.instance.id": f"{group}-{instance_id}"}
        config = (
            self._base
            | {
                "group.id": group,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest",
                # Workers need no co-partitioning: move only the partitions that must move.
                "partition.assignment.strategy": "cooperative-sticky",
            }
            | self._membership
            | static
        )
        return KafkaGroupConsumer(config, group, topics)

    def reader(self) -> Reader:
        """A reader of committed records, outside any group (fact batches expanded)."""
        return FactBatchReader(KafkaReader(dict(self._base)))

    def admin(self) -> KafkaAdmin:
        """An admin client."""
        return KafkaAdmin(dict(self._base), self.settings.partitions)


if TYPE_CHECKING:
    # Static proof that the Kafka clients implement the transport protocols.
    def _conforms(
        transport: KafkaTransport,
    ) -> tuple[Transport, ProcessorSession, Producer, GroupConsumer, Reader, AdminClient]:
        return (
            transport,
            transport.session("g", "i"),
            transport.producer(),
            transport.consumer("g", ()),
            transport.reader(),
            transport.admin(),
        )
