"""Worker consumers on the embedded log: a claim queue shared by a consumer group."""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from processor.errors import TransportError
from processor.transport.base import Closeable, Record, TopicPartition
from processor.transport.clock import wall_clock_ms
from processor.transport.embedded_sqlite import LogConnection, OffsetTable, fair_shares

__all__ = ["SESSION_TIMEOUT_MS", "EmbeddedConsumer"]

logger = logging.getLogger(__name__)

_CLAIMS = OffsetTable("claims")
_ACKS = OffsetTable("acks")

#: A member that has not said it is alive for this long is gone: its claims go to others.
SESSION_TIMEOUT_MS = 10_000

_LIVE = "SELECT member FROM members WHERE grp = ? AND alive_until_ms >= ?"
_ALIVE = (
    "INSERT INTO members (grp, member, alive_until_ms) VALUES (?, ?, ?)"
    " ON CONFLICT (grp, member) DO UPDATE SET alive_until_ms = excluded.alive_until_ms"
)
_LEAVE = "DELETE FROM members WHERE grp = ? AND member = ?"
_FORGET_GONE = "DELETE FROM members WHERE grp = ? AND alive_until_ms < ?"
_ORPHANS = (
    "SELECT topic, partition, offset FROM member_claims WHERE grp = ?"
    f" AND member NOT IN ({_LIVE}) AND topic IN (SELECT value FROM json_each(?))"
    " ORDER BY topic, partition, offset LIMIT ?"
)
_RECLAIM = (
    "UPDATE member_claims SET member = ? WHERE grp = ? AND topic = ? AND partition = ?"
    " AND offset = ?"
)
_OWN = (
    "SELECT topic, partition, offset FROM member_claims WHERE grp = ? AND member = ?"
    " AND topic IN (SELECT value FROM json_each(?)) ORDER BY topic, partition, offset"
)
_NOTE_CLAIM = "INSERT OR REPLACE INTO member_claims VALUES (?, ?, ?, ?, ?)"
_RELEASE = (
    "DELETE FROM member_claims WHERE grp = ? AND member = ? AND topic = ? AND partition = ?"
    " AND offset < ?"
)


class EmbeddedConsumer(Closeable):
    """A competing consumer of a group on the embedded log (workers, responders).

    The members of a group share one *claim position* per partition. ``poll``
    atomically (one write transaction) takes up to ``max_records`` records after
    the claim positions of its topics' partitions, moves the positions past them
    and returns them; so members in any number of threads or processes never get
    the same record while they live.

    Delivery is **at least once**, like a Kafka consumer group's: each member notes
    the records it claimed (``member_claims``) until it commits past them. A member
    that is gone (closed, or silent for ``session_timeout_ms``: a thread of each
    member says it is alive every third of that) leaves its uncommitted records to
    the next member that polls, before any new record. ``commit`` also records the
    acknowledged positions (table ``acks``) for observability. A new group starts
    at the earliest offset.

    A *static* member (``instance_id``, the in-process workers of ``processor run``)
    has that stable id: back after a crash, its first poll returns the records it had
    claimed and not committed, at once (no wait for its lease to run out).

    Use one consumer from one thread at a time.
    """

    def __init__(
        self,
        db_file: Path,
        durable: bool,
        group: str,
        topics: Sequence[str],
        instance_id: str | None = None,
        *,
        session_timeout_ms: int = SESSION_TIMEOUT_MS,
    ) -> None:
        self._log = LogConnection(db_file, durable)
        try:
            self._topics = [self._log.topic(name) for name in dict.fromkeys(topics)]
        except BaseException:
            self._log.close()
            raise
        self._metas = {meta.name: meta for meta in self._topics}
        self._topic_list = json.dumps(list(self._metas))
        self._group = group
        self._rotation = 0
        self._member = uuid.uuid4().hex if instance_id is None else f"static:{instance_id}"
        # A static member's claims of an earlier life still to redeliver (None: not read yet).
        self._earlier: list[tuple[str, int, int]] | None = None if instance_id else []
        self._session_ms = session_timeout_ms
        self._alive(self._log)
        self._leaving = threading.Event()
        self._held = False
        self._heart = threading.Thread(
            target=self._beat, args=(db_file, durable), name=f"member-{group}", daemon=True
        )
        self._heart.start()

    def poll(self, max_records: int, timeout_s: float) -> list[Record]:
        """Claim and return up to ``max_records`` records, waiting up to ``timeout_s``
        (while held: none, after ``timeout_s``)."""
        if self._held:
            self._leaving.wait(timeout_s)
            return []
        return self._log.poll_until(lambda: self._claim(max_records), timeout_s)

    def joined(self) -> bool:
        """Always: members claim records, not partitions, so a member that joins later
        takes nothing away from the others."""
        return True

    def hold(self, held: bool) -> None:
        self._held = held

    def commit_soon(self, consumed: Mapping[TopicPartition, int]) -> None:
        """As ``commit``: a local write has no broker round trip to spare."""
        self.commit(consumed)

    def commit(self, consumed: Mapping[TopicPartition, int]) -> None:
        """Acknowledge processing up to ``consumed`` (next offsets): those records are done."""
        if consumed:
            with self._log.write("acknowledge records") as conn:
                self._log.store_positions(_ACKS, self._group, consumed)
                conn.executemany(
                    _RELEASE,
                    [
                        (self._group, self._member, tp.topic, tp.partition, at)
                        for tp, at in consumed.items()
                    ],
                )

    def close(self) -> None:
        """Leave the group: records claimed and not committed go to the next member."""
        self._leaving.set()
        try:
            with self._log.write("leave group") as conn:
                conn.execute(_LEAVE, (self._group, self._member))
        except TransportError as exc:  # gone anyway once its lease runs out
            logger.warning("embedded consumer of %r: leave failed: %s", self._group, exc)
        self._log.close()

    def _alive(self, log: LogConnection) -> None:
        until = wall_clock_ms() + self._session_ms
        with log.write("keep membership") as conn:
            conn.execute(_ALIVE, (self._group, self._member, until))

    def _beat(self, db_file: Path, durable: bool) -> None:
        """Say this member is alive every third of the session timeout, until it leaves."""
        log = LogConnection(db_file, durable)
        try:
            while not self._leaving.wait(self._session_ms / 3000):
                try:
                    self._alive(log)
                except TransportError as exc:
                    logger.warning("embedded consumer of %r: %s", self._group, exc)
        finally:
            log.close()

    def _claim(self, max_records: int) -> list[Record]:
        """One attempt: a cheap read-only look first, then claim under the write lock."""
        if not (self._earlier != [] or self._available() or self._orphans(1, wall_clock_ms())):
            return []
        now = wall_clock_ms()
        with self._log.write("claim records") as conn:
            records = self._own_claims(max_records)
            records += self._reclaim(max_records - len(records), now)
            claimed = self._log.load_positions(_CLAIMS, self._group)
            self._rotation += 1
            budget = max_records - len(records)
            shares = fair_shares(self._available(claimed), budget, self._rotation) if budget else []
            positions: dict[TopicPartition, int] = {}
            for tp, count in shares:
                start = claimed.get(tp, 0)
                batch = self._log.fetch(
                    self._metas[tp.topic], tp.partition, start, start + count, count
                )
                positions[tp] = start + len(batch)
                records.extend(batch)
                conn.executemany(
                    _NOTE_CLAIM,
                    [(self._group, r.topic, r.partition, r.offset, self._member) for r in batch],
                )
            self._log.store_positions(_CLAIMS, self._group, positions)
        return records

    def _orphans(self, limit: int, now: int) -> list[tuple[str, int, int]]:
        """Up to ``limit`` records of our topics claimed by members that are gone."""
        with self._log.translated("look for orphaned claims"):
            rows = self._log.conn.execute(
                _ORPHANS, (self._group, self._group, now, self._topic_list, limit)
            ).fetchall()
        return [(topic, partition, offset) for topic, partition, offset in rows]

    def _own_claims(self, limit: int) -> list[Record]:
        """For a static member: up to ``limit`` of the records it claimed in an earlier
        life and did not commit (each once; they are its work already)."""
        if self._earlier is None:
            with self._log.translated("look for our earlier claims"):
                rows = self._log.conn.execute(
                    _OWN, (self._group, self._member, self._topic_list)
                ).fetchall()
            self._earlier = [(topic, partition, offset) for topic, partition, offset in rows]
            if rows:
                logger.info(
                    "embedded consumer of %r: %d records claimed before a restart, again",
                    self._group,
                    len(rows),
                )
        taken, self._earlier = self._earlier[:limit], self._earlier[limit:]
        records: list[Record] = []
        for topic, partition, offset in taken:
            meta = self._metas.get(topic)
            if meta is not None:
                records.extend(self._log.fetch(meta, partition, offset, offset + 1, 1))
        return records

    def _reclaim(self, max_records: int, now: int) -> list[Record]:
        """Take over up to ``max_records`` records claimed by members that are gone."""
        conn = self._log.conn
        rows = self._orphans(max_records, now) if max_records > 0 else []
        if not rows:
            return []
        conn.execute(_FORGET_GONE, (self._group, now))
        records: list[Record] = []
        for topic, partition, offset in rows:
            conn.execute(_RECLAIM, (self._member, self._group, topic, partition, offset))
            meta = self._metas.get(topic)
            if meta is not None:
                records.extend(self._log.fetch(meta, partition, offset, offset + 1, 1))
        if records:
            logger.info(
                "embedded consumer of %r: took over %d records of a member that left",
                self._group,
                len(records),
            )
        return records

    def _available(
        self, claimed: dict[TopicPartition, int] | None = None
    ) -> list[tuple[TopicPartition, int]]:
        """How many unclaimed records each partition of our topics holds."""
        if claimed is None:
            claimed = self._log.load_positions(_CLAIMS, self._group)
        return [
            (tp, end - claimed.get(tp, 0))
            for meta in self._topics
            for tp, end in self._log.partition_ends(meta)
            if end > claimed.get(tp, 0)
        ]
