"""The processor's session on Kafka: a group consumer plus a transactional producer (EOS v2).

Exactly-once v2 (KIP-447): one transactional producer per processor instance,
whose transactions carry the produced records *and* the consumed input offsets
(``send_offsets_to_transaction`` with the consumer's group metadata). Zombies
are fenced twice over: a new producer with the same ``transactional.id`` bumps
the producer epoch in ``init_transactions``, and the group coordinator refuses
offsets sent with a stale group generation.

The blocking transactional calls (init, send offsets, commit, abort) run under a
``Watchdog``: librdkafka can block in them past their timeout when the group
coordinator goes away (confluentinc/librdkafka#5456, #5511). A call that hangs
for longer than the transaction timeout plus a margin, when it could no longer
succeed anyway, makes the session lost (``SessionLostError``): the owner closes it
and opens a new one, whose ``init_transactions`` fences the stuck producer and
ends its transaction (committed or aborted) before the new session reads anything.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
)
from confluent_kafka import TopicPartition as KafkaTopicPartition

from processor.errors import FencedError, SessionLostError, TransportError
from processor.transport.base import Closeable, Outbound, PartitionsCallback, Record, TopicPartition
from processor.transport.kafka_common import (
    FENCED_CODES,
    GROUP_FENCED_CODES,
    ErrorReporter,
    kafka_error,
    kafka_offsets,
    partitions_of,
    records_of,
    require_topics,
    retrying,
    translate,
    wait_for_first,
)
from processor.transport.kafka_producer import produce_one
from processor.transport.kafka_stable import StableOffsets
from processor.transport.watchdog import Watchdog

__all__ = ["KafkaSession"]

logger = logging.getLogger(__name__)

#: librdkafka's default ``transaction.timeout.ms``, when the producer config has none.
_DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000
#: How long the lookup of the committed offsets after an assignment may take.
_COMMITTED_TIMEOUT_S = 10.0
#: One blocking transactional call (init, send offsets, commit, abort), retries included,
#: gets the transaction timeout plus this. The broker aborts an expired transaction
#: within its cleanup interval (``transaction.abort.timed.out.transaction.cleanup.
#: interval.ms``, 10 s by default), so later than that no commit can succeed anyway.
_TXN_MARGIN_S = 10.0
#: librdkafka's calls return by their own timeout unless they hang; the watchdog waits
#: this much longer before it abandons the producer.
_WATCHDOG_GRACE_S = 5.0
#: Delivery reports of a committed transaction are all queued when the commit returns;
#: serving them takes milliseconds. This bounds a broken client, not normal work.
_DELIVERY_REPORTS_TIMEOUT_S = 30.0
#: ``commit`` returns once its records are visible to read_committed readers (their
#: commit markers are written, normally within milliseconds), or after this long:
#: another producer's open transaction on a shared partition can hold the LSO back.
_VISIBILITY_TIMEOUT_S = 2.0


@dataclass(slots=True)
class _Transaction:
    """The open transaction: positions of produced records by produce order."""

    produced: list[tuple[TopicPartition, int] | None] = field(default_factory=list)
    pending: int = 0
    failures: list[KafkaError] = field(default_factory=list)
    revoked: bool = False


def _delivered(txn: _Transaction, index: int, err: KafkaError | None, msg: Message) -> None:
    """Delivery callback of a transactional record: remember where it landed."""
    txn.pending -= 1
    if err is not None:
        txn.failures.append(err)
        return
    tp = TopicPartition(msg.topic() or "", msg.partition() or 0)
    txn.produced[index] = (tp, msg.offset() or 0)


class KafkaSession(Closeable):
    """A processor instance's consumer-group member and transactional producer.

    - ``subscribe`` initializes the transactional producer (fencing any older
      producer with the same ``transactional.id``) and joins the group.
      Partitions are handed out by the ``range`` assignor, which gives one member
      the same partition numbers of every subscribed topic when the topics have
      equal partition counts: co-partitioning holds for the assignment too.
    - ``on_assign`` runs inside ``poll`` before any record of the new partitions
      is returned; ``on_revoke`` runs inside ``poll`` (or ``close``) before
      partitions are given away, also when they were lost (session timeout).
    - ``commit`` publishes produced records and consumed offsets atomically and
      returns once the records are visible to read_committed readers (Kafka
      writes commit markers asynchronously after ``commit_transaction``), so a
      read after ``commit`` sees them, as on the embedded log.
      It raises ``FencedError`` when another instance took over; the session is
      then fenced for good (``begin``/``poll`` raise it too): close it and open a
      new one. If the group rebalanced while a transaction was open, ``commit``
      aborts and raises ``FencedError``: the input may belong to another member.
      It raises ``SessionLostError`` when a transactional call hung past its
      deadline; every later call raises it too: close the session (it does not
      wait for the stuck producer) and open a new one.
    - ``abort`` discards the transaction and rewinds every partition to its last
      committed position, so the aborted input is polled again.

    Use one session from one thread at a time.
    """

    def __init__(
        self,
        consumer_config: dict[str, Any],
        producer_config: dict[str, Any],
        admin_config: dict[str, Any],
        group: str,
        instance_id: str,
    ) -> None:
        self._name = f"session {instance_id!r} of group {group!r}"
        #: What the transactional producer was made with (librdkafka cannot be asked back).
        self.producer_config: Mapping[str, Any] = MappingProxyType(dict(producer_config))
        self._reporter = ErrorReporter(self._name)
        timeout_ms = producer_config.get("transaction.timeout.ms", _DEFAULT_TRANSACTION_TIMEOUT_MS)
        self._txn_budget_s = int(timeout_ms) / 1000 + _TXN_MARGIN_S
        self._watchdog = Watchdog(self._name, self._txn_budget_s + _WATCHDOG_GRACE_S)
        self._stable = StableOffsets(admin_config | self._reporter.config())
        try:
            self._consumer = Consumer(consumer_config | self._reporter.config())
            try:
                self._producer = Producer(producer_config | self._reporter.config())
            except BaseException:
                self._consumer.close()
                raise
        except KafkaException as exc:
            raise translate(f"{self._name}: create clients", exc) from exc
        self._initialized = False
        self._subscribed = False
        self._on_assign: PartitionsCallback | None = None
        self._on_revoke: PartitionsCallback | None = None
        self._assigned: set[TopicPartition] = set()
        self._member_id = ""
        # Per partition: the committed position (rewind target) and the position
        # after the last record poll returned. A partition's baseline is learned
        # from the first record polled after assignment (the committed position, or
        # past control records and aborted data) and advanced by each commit.
        self._baseline: dict[TopicPartition, int] = {}
        self._position: dict[TopicPartition, int] = {}
        # The partitions revoked (or lost) during the poll under way: records of them
        # that the poll fetched before the rebalance are not ours to consume.
        self._revoked_in_poll: set[TopicPartition] = set()
        self._txn: _Transaction | None = None
        # Whether the producer has a transaction open that ``begin`` may take: one is
        # begun right after each commit (an empty transaction holds nothing on the
        # broker), so that ``begin`` costs nothing when a batch is ready.
        self._begun = False
        self._fenced = False
        self._closed = False

    # --- protocol ------------------------------------------------------------------------

    def subscribe(
        self, topics: Sequence[str], on_assign: PartitionsCallback, on_revoke: PartitionsCallback
    ) -> None:
        """Fence older producers of our transactional.id and join the group for ``topics``."""
        self._require_open()
        names = list(dict.fromkeys(topics))
        require_topics(self._consumer, names, self._name)
        if not self._initialized:
            try:
                self._txn_call("init transactions", self._producer.init_transactions)
            except KafkaException as exc:
                raise self._failed("init transactions", exc) from exc
            self._initialized = True
        self._on_assign, self._on_revoke = on_assign, on_revoke
        try:
            self._consumer.subscribe(
                names,
                on_assign=self._assigned_cb,
                on_revoke=self._revoked_cb,
                on_lost=self._lost_cb,
            )
        except KafkaException as exc:
            raise translate(f"{self._name}: subscribe", exc) from exc
        self._subscribed = True
        logger.info("%s: subscribed to %s", self._name, ", ".join(names))

    def poll(self, max_records: int, timeout_s: float) -> list[Record]:
        """Records after the consumed positions: those queued, else the first to arrive."""
        if not self._subscribed:
            raise TransportError(f"{self._name}: poll before subscribe")
        self._raise_if_fenced()
        self._revoked_in_poll.clear()
        try:
            messages = wait_for_first(
                self._consumer.consume, self._consumer.poll, max_records, timeout_s
            )
            self._producer.poll(0)  # serve the producer's error and log callbacks
        except KafkaException as exc:
            raise self._failed("poll", exc) from exc
        except RuntimeError as exc:  # the consumer was closed
            raise TransportError(f"{self._name}: poll: {exc}") from exc
        records = records_of(messages, self._name, self._reporter)
        if self._revoked_in_poll:
            records = self._drop_revoked(records)
        baseline, position = self._baseline, self._position
        for record in records:
            tp = record.position
            if tp not in baseline:
                baseline[tp] = record.offset
            position[tp] = record.offset + 1
        return records

    def _drop_revoked(self, records: list[Record]) -> list[Record]:
        """``records`` without those of partitions revoked during the poll.

        librdkafka hands over the records it fetched before a rebalance in the same
        batch as those after it. Consuming them would commit their offsets under the
        new generation, which the coordinator accepts: a partition's new owner that
        looked up its committed offset before then reads them again (a trigger's
        record submitted twice). A partition given back to us in the same rebalance is
        read again from its committed position.
        """
        revoked = self._revoked_in_poll
        kept = [record for record in records if record.position not in revoked]
        for tp in sorted(revoked & self._assigned):
            self._seek(tp, self._baseline.get(tp, OFFSET_BEGINNING), "reread")
        if len(kept) != len(records):
            logger.info(
                "%s: dropped %d records fetched before a rebalance",
                self._name,
                len(records) - len(kept),
            )
        return kept

    def begin(self) -> None:
        """Open a transaction (the one the last commit began, if it could)."""
        self._require_open()
        if self._txn is not None:
            raise TransportError(f"{self._name}: a transaction is already open")
        self._raise_if_fenced()
        if self._begun:
            self._begun = False
        else:
            self._begin_producer()
        self._txn = _Transaction()

    def _begin_producer(self) -> None:
        try:
            self._producer.begin_transaction()
        except KafkaException as exc:
            err = kafka_error(exc)
            if err is not None and err.code() == KafkaError._CONFLICT:
                # An earlier commit or abort is still in progress (it timed out while the
                # broker was away) and every begin would conflict with it: only a new
                # session's producer, fencing this one, gets past it.
                raise SessionLostError(
                    f"{self._name}: begin transaction: {err.str()}; opening a new session"
                ) from exc
            raise self._failed("begin transaction", exc) from exc

    def produce(self, record: Outbound) -> None:
        """Produce ``record`` into the open transaction."""
        txn = self._require_transaction("produce outside a transaction")
        index = len(txn.produced)
        txn.produced.append(None)
        txn.pending += 1
        try:
            produce_one(self._producer, record, functools.partial(_delivered, txn, index))
        except TransportError as exc:
            txn.produced.pop()
            txn.pending -= 1
            if isinstance(exc, FencedError):
                self._fenced = True
            raise

    def commit(self, consumed: Mapping[TopicPartition, int]) -> list[tuple[TopicPartition, int]]:
        """Commit the produced records with the consumed offsets; return their positions.

        ``consumed`` maps each input partition to the next offset to read.
        Raises ``FencedError`` when another instance took over (nothing is committed)
        and ``TransportError`` when the commit failed: if the transaction had to be
        aborted the input is rewound already, otherwise it is still open (retry
        ``commit`` or ``abort``).
        """
        txn = self._require_transaction("commit without begin")
        if txn.revoked:
            self._abort_open("partitions were revoked during the transaction")
            raise FencedError(
                f"{self._name}: the group rebalanced during the transaction; it was aborted"
            )
        if self._membership_lost():
            self._abort_open("this member left the group")
            self._fenced = True
            raise FencedError(
                f"{self._name}: no longer a member of the group (evicted after not polling "
                "for max.poll.interval.ms?); its partitions may belong to another instance"
            )
        try:
            self._send_offsets(self._fencing_offsets(consumed))
            self._txn_call("commit transaction", self._producer.commit_transaction)
        except KafkaException as exc:
            raise self._commit_failed(exc) from exc
        self._txn = None
        self._begin_next()
        self._baseline.update(consumed)
        self._reporter.recovered()
        positions = self._positions_of(txn)
        self._stable.wait_past(_ends(positions), _VISIBILITY_TIMEOUT_S)
        return positions

    def abort(self) -> None:
        """Discard the open transaction (if any) and rewind to the committed positions."""
        self._require_open()
        txn, self._txn = self._txn, None
        if txn is not None and not self._fenced:
            try:
                self._txn_call("abort transaction", self._producer.abort_transaction)
            except KafkaException as exc:
                raise self._failed("abort transaction", exc) from exc
        self._rewind()

    def committed_positions(self) -> dict[TopicPartition, int]:
        """The committed next offset of each assigned partition that has one (for lag)."""
        return {tp: base for tp, base in self._baseline.items() if tp in self._assigned}

    def close(self) -> None:
        """Abort an open transaction, leave the group (``on_revoke`` runs) and close."""
        if self._closed:
            return
        self._closed = True
        txn, self._txn = self._txn, None
        try:
            if txn is not None and not self._fenced and self._watchdog.stuck is None:
                self._abort_quietly()
        except SessionLostError:
            pass  # logged by the watchdog; the new session's producer ends the transaction
        finally:
            try:
                self._consumer.close()
            except (KafkaException, RuntimeError) as exc:
                logger.warning("%s: closing the consumer failed: %s", self._name, exc)
            finally:
                self._close_producer()
        logger.info("%s: closed", self._name)

    # --- rebalance callbacks (run inside consume/poll/close) -----------------------------

    def _assigned_cb(self, consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
        assigned = sorted(partitions_of(partitions))
        self._member_id = self._current_member_id()
        for tp in assigned:
            self._baseline.pop(tp, None)
            self._position.pop(tp, None)
        # The committed positions, so that even a commit before any record was polled
        # (timer facts right after the assignment) carries offsets (see _fencing_offsets).
        self._baseline.update(self._committed(consumer, partitions))
        self._assigned.update(assigned)
        logger.info("%s: assigned %s", self._name, _describe(assigned))
        if assigned and self._on_assign is not None:
            self._on_assign(assigned)

    def _committed(
        self, consumer: Consumer, partitions: list[KafkaTopicPartition]
    ) -> dict[TopicPartition, int]:
        """The group's committed offsets of ``partitions`` (those it has), once stable.

        The lookup (read_committed: KIP-447's stable offsets) fails while a previous
        owner's transaction holds offsets it sent but did not commit yet: a processor
        frozen (SIGSTOP, a long GC) between ``send_offsets_to_transaction`` and
        ``commit_transaction``, evicted meanwhile. That transaction may still commit,
        its facts with its offsets: taking the partitions over before it ends would
        catch the stores up without those facts, and never see those inputs again. So
        the lookup is repeated until it succeeds, for up to the transaction budget (the
        broker has aborted any such transaction by then); {} if it never does.
        """
        if not partitions:
            return {}
        deadline = time.monotonic() + self._txn_budget_s
        while True:
            try:
                found = consumer.committed(partitions, timeout=_COMMITTED_TIMEOUT_S)
                break
            except KafkaException as exc:
                if self._closed or not _unstable(kafka_error(exc)):
                    logger.warning("%s: committed offsets unknown: %s", self._name, exc)
                    return {}  # closing (an assignment served by close), or a hard error
                if time.monotonic() >= deadline:
                    logger.error(
                        "%s: committed offsets still unknown %.0f s after assignment: %s",
                        self._name,
                        self._txn_budget_s,
                        exc,
                    )
                    return {}
                logger.warning(
                    "%s: committed offsets not stable yet (a previous owner's open "
                    "transaction?), looking again: %s",
                    self._name,
                    exc,
                )
        return {
            TopicPartition(p.topic, p.partition): p.offset
            for p in found
            if p.error is None and p.offset >= 0
        }

    def _revoked_cb(self, consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
        self._revoke(partitions_of(partitions), "revoked")

    def _lost_cb(self, consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
        self._revoke(partitions_of(partitions), "lost")

    def _revoke(self, partitions: Sequence[TopicPartition], how: str) -> None:
        """Forget ``partitions`` and tell the owner, once per assignment."""
        revoked = sorted(tp for tp in partitions if tp in self._assigned)
        self._revoked_in_poll.update(revoked)
        for tp in revoked:
            self._assigned.discard(tp)
            self._baseline.pop(tp, None)
            self._position.pop(tp, None)
        if self._txn is not None and revoked:
            self._txn.revoked = True
        if revoked:
            logger.info("%s: %s %s", self._name, how, _describe(revoked))
            if self._on_revoke is not None:
                self._on_revoke(revoked)

    # --- helpers -------------------------------------------------------------------------

    def _current_member_id(self) -> str:
        try:
            return self._consumer.memberid() or ""
        except (KafkaException, RuntimeError):
            return ""

    def _membership_lost(self) -> bool:
        """True when we hold partitions but the consumer is no longer the member that got them.

        A member that stops polling for ``max.poll.interval.ms`` is evicted by
        librdkafka (LeaveGroup) and its partitions go to others, but its
        rebalance callbacks only run at its next poll. Its group metadata then
        carries no member id and generation -1, which the coordinator accepts
        for transactional offsets, so the check must be ours.
        """
        return bool(self._assigned) and self._current_member_id() != self._member_id

    def _fencing_offsets(self, consumed: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """The offsets to commit: ``consumed``, else the committed positions we know.

        A commit of timer facts consumes nothing, but offsets in the transaction are
        what makes the group coordinator check our generation (KIP-447): without
        any, a member whose partitions were just given away could still commit
        timer facts. Sending a committed position again changes nothing. (They are
        looked up on assignment; only a partition the group never committed has none.)
        """
        if consumed:
            return dict(consumed)
        return {tp: base for tp, base in self._baseline.items() if tp in self._assigned}

    def _begin_next(self) -> None:
        """Open the next transaction now, off the next batch's path; if that fails, the
        next ``begin`` tries again and says why."""
        try:
            self._producer.begin_transaction()
        except KafkaException as exc:
            logger.debug("%s: beginning the next transaction failed: %s", self._name, exc)
            return
        self._begun = True

    def _send_offsets(self, offsets: Mapping[TopicPartition, int]) -> None:
        if not offsets:
            return
        partitions = kafka_offsets(offsets)
        metadata = self._consumer.consumer_group_metadata()
        self._txn_call(
            "send offsets to transaction",
            lambda timeout_s: self._producer.send_offsets_to_transaction(
                partitions, metadata, timeout_s
            ),
        )

    def _txn_call(self, what: str, call: Callable[[float], object]) -> None:
        """One blocking transactional call under the watchdog, retried while retriable.

        ``call`` takes its timeout: what is left of the budget of the call. Raises
        ``KafkaException`` when it failed, ``SessionLostError`` when it hung.
        """
        deadline = time.monotonic() + self._txn_budget_s

        def attempt() -> object:
            return call(max(deadline - time.monotonic(), 0.1))

        self._watchdog.call(
            what, lambda: retrying(f"{self._name}: {what}", attempt, self._txn_budget_s)
        )

    def _failed(self, what: str, exc: KafkaException) -> TransportError:
        """Translate ``exc``; a fenced or fatal error fences the session for good."""
        error = translate(f"{self._name}: {what}", exc)
        if isinstance(error, FencedError):
            self._fenced = True
            self._txn = None
        return error

    def _commit_failed(self, exc: KafkaException) -> TransportError:
        """Translate a failed commit, aborting the transaction where that is possible."""
        err = kafka_error(exc)
        if err is None or err.fatal() or err.code() in FENCED_CODES:
            return self._failed("commit", exc)
        if err.code() in GROUP_FENCED_CODES:
            self._abort_open(str(err))
            self._fenced = True
            return FencedError(f"{self._name}: commit refused, the group moved on ({err})")
        if err.txn_requires_abort():
            self._abort_open(str(err))
            return TransportError(f"{self._name}: commit failed, transaction aborted ({err})")
        return TransportError(f"{self._name}: commit failed, transaction still open ({err})")

    def _abort_open(self, reason: str) -> None:
        """Abort the open transaction after a failed commit and rewind the input."""
        logger.warning("%s: aborting the transaction: %s", self._name, reason)
        self._txn = None
        self._abort_quietly()
        self._rewind()

    def _abort_quietly(self) -> None:
        try:
            self._txn_call("abort transaction", self._producer.abort_transaction)
        except KafkaException as exc:
            err = kafka_error(exc)
            if err is not None and (err.fatal() or err.code() in FENCED_CODES):
                self._fenced = True
            logger.warning("%s: abort failed: %s", self._name, exc)

    def _rewind(self) -> None:
        """Seek every partition polled past its committed position back to it."""
        for tp, position in list(self._position.items()):
            base = self._baseline.get(tp)
            if base is None or base == position or tp not in self._assigned:
                continue
            self._seek(tp, base, "rewind")
            self._position[tp] = base

    def _seek(self, tp: TopicPartition, offset: int, what: str) -> None:
        """Read ``tp`` next from ``offset``, its committed position.

        A partition just assigned does not fetch until the client has looked up its
        committed offset, and refuses a seek until then (``_STATE``): it will start
        from that offset, where the seek would have put it.
        """
        try:
            self._consumer.seek(KafkaTopicPartition(tp.topic, tp.partition, offset))
        except KafkaException as exc:
            err = kafka_error(exc)
            if err is not None and err.code() == KafkaError._STATE:
                logger.debug("%s: %s %s: not fetching yet", self._name, what, tp)
                return
            raise translate(f"{self._name}: {what} {tp.topic}[{tp.partition}]", exc) from exc

    def _positions_of(self, txn: _Transaction) -> list[tuple[TopicPartition, int]]:
        """Wait for every delivery report of the committed transaction (normally queued)."""
        deadline = time.monotonic() + _DELIVERY_REPORTS_TIMEOUT_S
        while txn.pending > 0:
            self._producer.poll(0.01)
            if time.monotonic() >= deadline:
                raise TransportError(f"{self._name}: delivery reports missing after commit")
        positions = [position for position in txn.produced if position is not None]
        if len(positions) != len(txn.produced):
            raise TransportError(f"{self._name}: committed, but deliveries failed: {txn.failures}")
        return positions

    def _raise_if_fenced(self) -> None:
        self._watchdog.check()
        if self._fenced or self._reporter.fatal is not None:
            self._fenced = True
            self._revoke(sorted(self._assigned), "revoked (fenced)")
            raise FencedError(f"{self._name} is fenced; close it and open a new session")

    def _require_open(self) -> None:
        if self._closed:
            raise TransportError(f"{self._name} is closed")
        self._watchdog.check()

    def _require_transaction(self, misuse: str) -> _Transaction:
        self._require_open()
        if self._txn is None:
            raise TransportError(f"{self._name}: {misuse}")
        return self._txn

    def _close_producer(self) -> None:
        """Close the producer on the watchdog's thread (after its stuck call, if one hung)."""
        self._watchdog.close(self._close_producer_now)

    def _close_producer_now(self) -> None:
        try:
            self._producer.purge()
            self._producer.flush(0)
            self._producer.close()
        except (KafkaException, RuntimeError) as exc:
            logger.warning("%s: closing the producer failed: %s", self._name, exc)


def _unstable(err: KafkaError | None) -> bool:
    """Whether a failed lookup of committed offsets may succeed later: offsets still
    pending in an open transaction (the lookup retries those until its timeout)."""
    if err is None:
        return False
    return err.code() in (KafkaError._TIMED_OUT, KafkaError.UNSTABLE_OFFSET_COMMIT) or bool(
        err.retriable()
    )


def _ends(positions: list[tuple[TopicPartition, int]]) -> dict[TopicPartition, int]:
    """The offset after the last produced record of each partition."""
    ends: dict[TopicPartition, int] = {}
    for tp, offset in positions:
        if offset >= ends.get(tp, 0):
            ends[tp] = offset + 1
    return ends


def _describe(partitions: Sequence[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in partitions) or "nothing"
