"""Worker consumers on the embedded log: a claim queue shared by a consumer group."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from processor.transport.base import Closeable, Record, TopicPartition
from processor.transport.embedded_sqlite import LogConnection, OffsetTable, fair_shares

__all__ = ["EmbeddedConsumer"]

logger = logging.getLogger(__name__)

_CLAIMS = OffsetTable("claims")
_ACKS = OffsetTable("acks")


class EmbeddedConsumer(Closeable):
    """A competing consumer of a group on the embedded log (workers, responders).

    The members of a group share one *claim position* per partition. ``poll``
    atomically (one write transaction) takes up to ``max_records`` records after
    the claim positions of its topics' partitions, moves the positions past them
    and returns them; so members in any number of threads or processes never get
    the same record.

    Delivery is **at most once per claim**: records are claimed when polled, not
    when committed. A member that dies after ``poll`` and before finishing its
    records loses them; nobody else will be handed them again. The engine accepts
    this because it re-dispatches work whose attempt timed out. ``commit`` only
    records the acknowledged positions (table ``acks``) for observability; it does
    not change what is delivered. A new group starts at the earliest offset.

    Use one consumer from one thread at a time.
    """

    def __init__(self, db_file: Path, durable: bool, group: str, topics: Sequence[str]) -> None:
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
        if consumed:
            with self._log.write("acknowledge records"):
                self._log.store_positions(_ACKS, self._group, consumed)

    def close(self) -> None:
        """Close the connection; records claimed and not processed are lost (see class doc)."""
        self._log.close()

    def _claim(self, max_records: int) -> list[Record]:
        """One attempt: a cheap read-only look first, then claim under the write lock."""
        if not self._available():
            return []
        with self._log.write("claim records"):
            claimed = self._log.load_positions(_CLAIMS, self._group)
            self._rotation += 1
            shares = fair_shares(self._available(claimed), max_records, self._rotation)
            records: list[Record] = []
            positions: dict[TopicPartition, int] = {}
            for tp, count in shares:
                start = claimed.get(tp, 0)
                batch = self._log.fetch(
                    self._metas[tp.topic], tp.partition, start, start + count, count
                )
                positions[tp] = start + len(batch)
                records.extend(batch)
            self._log.store_positions(_CLAIMS, self._group, positions)
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
