"""The processor's session on the embedded log: one owner per group, atomic commits."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from processor.errors import FencedError, TransportError
from processor.transport.base import Closeable, Outbound, PartitionsCallback, Record, TopicPartition
from processor.transport.embedded_sqlite import (
    SESSION_OFFSETS,
    LogConnection,
    PendingRecord,
    TopicMeta,
    fair_shares,
)

__all__ = ["EmbeddedSession"]

logger = logging.getLogger(__name__)

_TAKE_OWNERSHIP = (
    "INSERT INTO group_owners (grp, epoch, instance_id) VALUES (?, 1, ?)"
    " ON CONFLICT (grp) DO UPDATE SET epoch = epoch + 1, instance_id = excluded.instance_id"
)
_SELECT_OWNER = "SELECT epoch, instance_id FROM group_owners WHERE grp = ?"


class EmbeddedSession(Closeable):
    """A processor instance's consumer and transactional producer on the embedded log.

    ``subscribe`` makes this instance the only owner of the group: it bumps the
    group's epoch and is assigned every partition of the subscribed topics
    (``on_assign`` runs in the first ``poll``). An instance that subscribes later
    fences this one: its next ``commit`` raises ``FencedError`` and commits
    nothing, and its next ``poll`` calls ``on_revoke`` and raises ``FencedError``.
    A fenced session stays fenced: close it and open a new session (calling
    ``subscribe`` again would take the group back and fence the other instance).

    Polling starts at the group's committed offsets (offset 0 where none were
    committed). ``commit`` publishes the buffered records, assigning their offsets,
    and the consumed offsets in one SQLite transaction; ``abort`` drops the buffer
    (nothing reached the database) and rewinds polling to the committed offsets.

    ``close`` discards an open transaction and, like a Kafka consumer leaving
    its group, calls ``on_revoke`` for the partitions still assigned.

    Use one session from one thread at a time.
    """

    def __init__(self, db_file: Path, durable: bool, group: str, instance_id: str) -> None:
        self._log = LogConnection(db_file, durable)
        self._group = group
        self._instance_id = instance_id
        self._topics: list[TopicMeta] = []
        self._metas: dict[str, TopicMeta] = {}
        self._on_assign: PartitionsCallback | None = None
        self._on_revoke: PartitionsCallback | None = None
        self._epoch: int | None = None
        self._assignment_due = False
        self._assigned: list[TopicPartition] = []
        self._positions: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}
        self._buffer: list[PendingRecord] | None = None
        self._fenced = False
        self._rotation = 0

    def subscribe(
        self, topics: Sequence[str], on_assign: PartitionsCallback, on_revoke: PartitionsCallback
    ) -> None:
        """Take ownership of the group and ask for every partition of ``topics``."""
        self._topics = [self._log.topic(name) for name in dict.fromkeys(topics)]
        self._metas = {meta.name: meta for meta in self._topics}
        self._on_assign, self._on_revoke = on_assign, on_revoke
        with self._log.write("subscribe") as conn:
            conn.execute(_TAKE_OWNERSHIP, (self._group, self._instance_id))
            self._epoch = int(conn.execute(_SELECT_OWNER, (self._group,)).fetchone()[0])
        self._fenced = False
        self._assignment_due = True
        logger.info(
            "embedded session %s owns group %s (epoch %d)",
            self._instance_id,
            self._group,
            self._epoch,
        )

    def poll(self, max_records: int, timeout_s: float) -> list[Record]:
        """Return records after the consumed position, waiting up to ``timeout_s`` for some."""
        if self._epoch is None:
            raise TransportError(f"session {self._instance_id!r}: poll before subscribe")
        self._raise_if_fenced()
        if self._assignment_due:
            self._assign()
        return self._log.poll_until(lambda: self._fetch(max_records), timeout_s)

    def begin(self) -> None:
        """Open a transaction: produced records are buffered until ``commit``."""
        if self._buffer is not None:
            raise TransportError(f"session {self._instance_id!r}: a transaction is already open")
        self._raise_if_fenced()
        self._buffer = []

    def produce(self, record: Outbound) -> None:
        """Buffer ``record`` in the open transaction."""
        if self._buffer is None:
            raise TransportError(f"session {self._instance_id!r}: produce outside a transaction")
        self._buffer.append(self._log.pending(record))

    def commit(self, consumed: Mapping[TopicPartition, int]) -> list[tuple[TopicPartition, int]]:
        """Publish the buffered records and the consumed offsets in one SQLite transaction.

        Returns the position of each produced record, in produce order. Raises
        ``FencedError`` (and commits nothing) when another instance owns the group.
        On any other ``TransportError`` the transaction stays open: retry or abort.
        """
        buffer = self._require_transaction()
        try:
            with self._log.write("commit transaction"):
                self._verify_owner()
                positions = self._log.append(buffer)
                self._log.store_positions(SESSION_OFFSETS, self._group, consumed)
        except FencedError:
            self._fenced, self._buffer = True, None
            raise
        self._buffer = None
        self._committed.update(consumed)
        return positions

    def abort(self) -> None:
        """Discard the open transaction; rewind to the committed offsets to poll the input again."""
        self._buffer = None
        self._positions = {tp: self._committed.get(tp, 0) for tp in self._assigned}

    def committed_positions(self) -> dict[TopicPartition, int]:
        """The committed next offset of each assigned partition (for lag)."""
        return {tp: self._committed.get(tp, 0) for tp in self._assigned}

    def close(self) -> None:
        """Discard any open transaction, revoke the assignment and close the connection."""
        if self._log.closed:
            return
        self._buffer = None
        try:
            self._revoke()
        finally:
            self._log.close()

    def _assign(self) -> None:
        """Deliver the assignment: revoke an older one, load committed offsets, call on_assign."""
        self._revoke()
        partitions = [tp for meta in self._topics for tp, _ in self._log.partition_ends(meta)]
        committed = self._log.load_positions(SESSION_OFFSETS, self._group)
        self._committed = {tp: committed.get(tp, 0) for tp in partitions}
        self._positions = dict(self._committed)
        self._assignment_due = False
        self._assigned = partitions
        if self._on_assign is not None:
            self._on_assign(list(partitions))

    def _revoke(self) -> None:
        assigned, self._assigned = self._assigned, []
        self._positions = {}
        if assigned and self._on_revoke is not None:
            self._on_revoke(assigned)

    def _fetch(self, max_records: int) -> list[Record]:
        """One attempt: records from the partitions that have some, shared fairly."""
        try:
            self._verify_owner()
        except FencedError:
            self._revoke()
            raise
        available = [
            (tp, end - self._positions[tp])
            for meta in self._topics
            for tp, end in self._log.partition_ends(meta)
        ]
        self._rotation += 1
        records: list[Record] = []
        for tp, count in fair_shares(available, max_records, self._rotation):
            start = self._positions[tp]
            batch = self._log.fetch(
                self._metas[tp.topic], tp.partition, start, start + count, count
            )
            self._positions[tp] = start + len(batch)
            records.extend(batch)
        return records

    def _verify_owner(self) -> None:
        """Raise FencedError when the group's epoch moved past ours."""
        with self._log.translated("read group owner"):
            epoch, owner = self._log.conn.execute(_SELECT_OWNER, (self._group,)).fetchone()
        if epoch != self._epoch:
            self._fenced = True
            raise FencedError(
                f"session {self._instance_id!r} of group {self._group!r} was fenced: "
                f"instance {owner!r} took the group over (epoch {epoch}, ours {self._epoch})"
            )

    def _raise_if_fenced(self) -> None:
        if self._fenced:
            self._revoke()
            raise FencedError(
                f"session {self._instance_id!r} of group {self._group!r} is fenced; "
                "close it and open a new session"
            )

    def _require_transaction(self) -> list[PendingRecord]:
        if self._buffer is None:
            raise TransportError(f"session {self._instance_id!r}: commit without begin")
        return self._buffer
