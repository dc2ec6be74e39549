"""The at-least-once Kafka consumer-group member for workers and responders."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException

from processor.errors import FencedError, TransportError
from processor.transport.base import Closeable, Record, TopicPartition
from processor.transport.kafka_common import (
    ErrorReporter,
    is_fatal,
    kafka_error,
    kafka_offsets,
    records_of,
    require_topics,
    translate,
    wait_for_first,
)

__all__ = ["KafkaGroupConsumer"]

logger = logging.getLogger(__name__)


#: How long ``commit`` retries while the group is rebalancing: the coordinator refuses
#: commits between the join and sync phases, which take milliseconds.
_COMMIT_DEADLINE_S = 10.0
_REBALANCING = frozenset({KafkaError.REBALANCE_IN_PROGRESS, KafkaError.ILLEGAL_GENERATION})


def _failures(failed: Sequence[Any]) -> str:
    """The partitions of a commit that failed, with their errors."""
    return ", ".join(f"{tp.topic}[{tp.partition}]: {tp.error}" for tp in failed)


def _dead(err: KafkaError | None) -> bool:
    """Whether ``err`` ends the consumer: fatal, or its static identity taken by another
    member (librdkafka makes that fatal too). A rebalance's ILLEGAL_GENERATION or
    UNKNOWN_MEMBER_ID does not: librdkafka joins again by itself."""
    return err is not None and (is_fatal(err) or err.code() == KafkaError.FENCED_INSTANCE_ID)


def _transient(err: KafkaError | None) -> bool:
    return err is not None and (err.retriable() or err.code() in _REBALANCING)


class KafkaGroupConsumer(Closeable):
    """A member of consumer group ``group`` reading ``topics`` (read_committed).

    Delivery is at least once: offsets are committed only by ``commit``
    (synchronously), so records polled and not committed are delivered again,
    to this or another member, after a restart or rebalance. A new group starts
    at the earliest offset. Use one consumer from one thread at a time.

    A consumer that librdkafka declares dead (a fatal error: for a static member,
    another consumer with its ``group.instance.id`` took its place) raises
    ``FencedError`` from every later call: close it and open a new one. Left alone
    it would poll nothing, forever.
    """

    def __init__(self, config: dict[str, Any], group: str, topics: Sequence[str]) -> None:
        self._name = f"consumer of group {group!r}"
        self._reporter = ErrorReporter(self._name)
        self._ended_by: KafkaError | None = None  # a commit refused for good (``_dead``)
        self._joined = False  # set by the first assignment (``_assigned``, during a poll)
        self._held = False  # partitions assigned meanwhile are paused (``hold``)
        try:
            self._consumer = Consumer(
                config | self._reporter.config() | {"on_commit": self._on_commit}
            )
        except KafkaException as exc:
            raise translate(f"{self._name}: create consumer", exc) from exc
        try:
            names = list(dict.fromkeys(topics))
            require_topics(self._consumer, names, self._name)
            self._consumer.subscribe(names, on_assign=self._assigned)
        except KafkaException as exc:
            self._consumer.close()
            raise translate(f"{self._name}: subscribe", exc) from exc
        except TransportError:
            self._consumer.close()
            raise
        self._closed = False

    def _assigned(self, consumer: Any, partitions: list[Any]) -> None:
        """Take ``partitions``, paused while held, else resumed: librdkafka keeps a
        partition's pause across its revocation, so one paused by a hold, lost as
        another member joined and given back later (that member gone) would stay
        paused, and its records unread, for good."""
        self._joined = True  # even with no partition: the group's balance counts us
        if partitions:
            consumer.incremental_assign(partitions)  # assigned here, to set the pause
            (consumer.pause if self._held else consumer.resume)(partitions)

    def joined(self) -> bool:
        return self._joined

    def hold(self, held: bool) -> None:
        """While held, partitions assigned are paused: polls fetch nothing."""
        self._require_open()
        self._held = held
        try:
            assigned = self._consumer.assignment()
            if assigned:
                (self._consumer.pause if held else self._consumer.resume)(assigned)
        except KafkaException as exc:
            raise translate(f"{self._name}: hold", exc) from exc

    def poll(self, max_records: int, timeout_s: float) -> list[Record]:
        """Records queued for us, else the first to arrive within ``timeout_s``."""
        self._require_open()
        try:
            messages = wait_for_first(
                self._consumer.consume, self._consumer.poll, max_records, timeout_s
            )
        except KafkaException as exc:
            raise translate(f"{self._name}: poll", exc) from exc
        records = records_of(messages, self._name, self._reporter)
        if records:
            records = self._still_assigned(records)
        return records

    def commit(self, consumed: Mapping[TopicPartition, int]) -> None:
        """Commit ``consumed`` (next offset to read per partition) synchronously."""
        self._require_open()
        if not consumed:
            return
        offsets = kafka_offsets(consumed)
        deadline = time.monotonic() + _COMMIT_DEADLINE_S
        while True:
            try:
                results = self._consumer.commit(offsets=offsets, asynchronous=False)
                failed = [tp for tp in results if tp.error is not None]
                if not failed:
                    return
                err: KafkaError | None = failed[0].error
            except KafkaException as exc:
                err = kafka_error(exc)
                if not _transient(err) or time.monotonic() >= deadline:
                    raise translate(f"{self._name}: commit", exc) from exc
                continue
            if _dead(err):
                self._ended_by = err
                raise FencedError(f"{self._name}: commit refused for {_failures(failed)}")
            if not _transient(err) or time.monotonic() >= deadline:
                raise TransportError(f"{self._name}: commit failed for {_failures(failed)}")

    def commit_soon(self, consumed: Mapping[TopicPartition, int]) -> None:
        """Send the commit of ``consumed`` and return; librdkafka reports the outcome to
        ``_on_commit`` during a later poll."""
        self._require_open()
        if not consumed:
            return
        try:
            self._consumer.commit(offsets=kafka_offsets(consumed), asynchronous=True)
        except KafkaException as exc:
            raise translate(f"{self._name}: commit", exc) from exc

    def _on_commit(self, err: KafkaError | None, partitions: list[Any]) -> None:
        failed = [tp for tp in partitions if tp.error is not None]
        dead = [e for e in (err, *(tp.error for tp in failed)) if _dead(e)]
        if dead:
            self._ended_by = dead[0]
        if err is not None or failed:
            detail = err or _failures(failed)
            logger.warning("%s: commit failed, delivered again at worst: %s", self._name, detail)

    def close(self) -> None:
        """Leave the group; uncommitted records will be delivered again."""
        if self._closed:
            return
        self._closed = True
        try:
            self._consumer.close()
        except (KafkaException, RuntimeError) as exc:
            logger.warning("%s: close failed: %s", self._name, exc)

    def _still_assigned(self, records: list[Record]) -> list[Record]:
        """Drop records of partitions revoked by a rebalance served in the same poll.

        Their offsets will not be committed by us, so the new owner gets them.
        """
        try:
            assigned = {(tp.topic, tp.partition) for tp in self._consumer.assignment()}
        except KafkaException as exc:
            raise translate(f"{self._name}: assignment", exc) from exc
        if all((r.topic, r.partition) in assigned for r in records):
            return records
        return [r for r in records if (r.topic, r.partition) in assigned]

    def _require_open(self) -> None:
        if self._closed:
            raise TransportError(f"{self._name} is closed")
        dead = self._reporter.fatal or self._ended_by
        if dead is not None:
            raise FencedError(f"{self._name} is dead ({dead}); close it and open a new one")
