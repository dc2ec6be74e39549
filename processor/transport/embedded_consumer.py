"""Worker consumers on the embedded log: a claim queue shared by a consumer group."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from processor.transport.base import Closeable, Record, TopicPartition
from processor.transport.clock import wall_clock_ms
from processor.transport.embedded_sqlite import LogConnection, OffsetTable, fair_shares

__all__ = ["HOLD_LEASE_MS", "EmbeddedConsumer"]

logger = logging.getLogger(__name__)

_CLAIMS = OffsetTable("claims")
_ACKS = OffsetTable("acks")
#: How long a member may hold claimed records without polling or acknowledging before
#: another member of its group is handed them (Kafka's default max.poll.interval.ms).
HOLD_LEASE_MS = 300_000

_HOLD = "INSERT INTO held VALUES (?, ?, ?, ?, ?, ?, ?)"
_REFRESH = "UPDATE held SET seen_ms = ? WHERE grp = ? AND member = ?"
_TAKEABLE = (
    "SELECT topic, partition, start_offset, end_offset FROM held WHERE grp = ?"
    " AND ((member = ? AND ?) OR seen_ms < ?) ORDER BY topic, partition, start_offset"
)
_TAKE = "UPDATE held SET member = ?, seen_ms = ? WHERE grp = ? AND topic = ? AND partition = ?"
_ACKED = (
    "DELETE FROM held WHERE grp = ? AND topic = ? AND partition = ? AND member = ?"
    " AND end_offset <= ?"
)
_ACKED_PART = (
    "UPDATE held SET start_offset = ? WHERE grp = ? AND topic = ? AND partition = ?"
    " AND member = ? AND start_offset < ? AND end_offset > ?"
)


class EmbeddedConsumer(Closeable):
    """A competing consumer of a group on the embedded log (workers, responders).

    The members of a group share one *claim position* per partition. ``poll``
    atomically (one write transaction) takes up to ``max_records`` records after
    the claim positions of its topics' partitions, moves the positions past them
    and returns them; so members in any number of threads or processes never get
    the same record.

    Delivery is **at least once**: a member holds what it claimed (table ``held``)
    until it commits past it. A member that dies first gets its records again when it
    comes back with the same ``instance_id`` (the in-process workers of ``processor
    run``: at once), and any member of the group gets them once the holder has
    neither polled nor committed for ``lease_ms`` (or at once after it closed). A
    new group starts at the earliest offset.

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
        lease_ms: int = HOLD_LEASE_MS,
    ) -> None:
        self._member = instance_id or f"member-{uuid.uuid4().hex}"
        self._resumed = instance_id is None  # a new member holds nothing of its own yet
        self._lease_ms = lease_ms
        self._log = LogConnection(db_file, durable)
        try:
            self._topics = [self._log.topic(name) for name in dict.fromkeys(topics)]
        except BaseException:
            self._log.close()
            raise
        self._metas = {meta.name: meta for meta in self._topics}
        self._group = group
        self._rotation = 0

    def poll(self, max_records: int, timeout_s: float) -> list[Record]:
        """Claim and return up to ``max_records`` records, waiting up to ``timeout_s``."""
        return self._log.poll_until(lambda: self._claim(max_records), timeout_s)

    def commit(self, consumed: Mapping[TopicPartition, int]) -> None:
        """Acknowledge processing up to ``consumed`` (next offsets); delivery is unaffected."""
        if not consumed:
            return
        with self._log.write("acknowledge records") as conn:
            self._log.store_positions(_ACKS, self._group, consumed)
            for tp, end in consumed.items():
                key = (self._group, tp.topic, tp.partition, self._member)
                conn.execute(_ACKED, (*key, end))
                conn.execute(_ACKED_PART, (end, *key, end, end))
            conn.execute(_REFRESH, (wall_clock_ms(), self._group, self._member))

    def close(self) -> None:
        """Close the connection; what it holds unacknowledged goes to the group at once."""
        if not self._log.closed:
            try:
                with self._log.write("release held records") as conn:
                    conn.execute(_REFRESH, (0, self._group, self._member))
            finally:
                self._log.close()

    def _claim(self, max_records: int) -> list[Record]:
        """One attempt: a cheap read-only look first, then claim under the write lock."""
        now = wall_clock_ms()
        if not self._available() and not self._takeable(now):
            return []
        with self._log.write("claim records") as conn:
            conn.execute(_REFRESH, (now, self._group, self._member))
            records = self._take_held(now, max_records)
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
                if batch:
                    row = (self._group, tp.topic, tp.partition, start, start + len(batch))
                    conn.execute(_HOLD, (*row, self._member, now))
            self._log.store_positions(_CLAIMS, self._group, positions)
        return records

    def _takeable(self, now: int) -> list[tuple[str, int, int, int]]:
        """Held ranges this member may take: its own from before it came back, and any
        whose holder's lease ran out."""
        args = (self._group, self._member, not self._resumed, now - self._lease_ms)
        with self._log.translated("read held records"):
            rows = self._log.conn.execute(_TAKEABLE, args).fetchall()
        return [row for row in rows if row[0] in self._metas]

    def _take_held(self, now: int, max_records: int) -> list[Record]:
        """Take over held ranges (whole ones, so a range may exceed ``max_records``)."""
        records: list[Record] = []
        for topic, partition, start, end in self._takeable(now):
            if records and len(records) + end - start > max_records:
                return records  # the rest at the next poll
            self._log.conn.execute(
                _TAKE + " AND start_offset = ?",
                (self._member, now, self._group, topic, partition, start),
            )
            records.extend(self._log.fetch(self._metas[topic], partition, start, end, end - start))
            logger.info(
                "%s: redelivered %s/%d [%d, %d)", self._member, topic, partition, start, end
            )
        self._resumed = True
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
