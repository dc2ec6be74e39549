"""Which offsets a worker may commit: only below the oldest record it has not finished.

Records finish out of order when attempts run concurrently. Committing past an
unfinished one would lose it in a crash; committing up to it redelivers it (and the
finished records after it: their results are produced again, and refused as
duplicates by the processor).
"""

from __future__ import annotations

import threading

from processor.transport.base import Record, TopicPartition

__all__ = ["PendingOffsets"]


class PendingOffsets:
    """The records taken and not finished, per partition (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[TopicPartition, set[int]] = {}
        self._next: dict[TopicPartition, int] = {}  # after the last record taken
        self._committed: dict[TopicPartition, int] = {}

    def taken(self, record: Record) -> None:
        with self._lock:
            tp = record.position
            self._open.setdefault(tp, set()).add(record.offset)
            self._next[tp] = max(self._next.get(tp, 0), record.offset + 1)

    def finished(self, record: Record) -> None:
        with self._lock:
            self._open.get(record.position, set()).discard(record.offset)

    def unfinished(self) -> int:
        with self._lock:
            return sum(len(offsets) for offsets in self._open.values())

    def committable(self) -> dict[TopicPartition, int]:
        """The next offset to commit of each partition whose position moved."""
        with self._lock:
            positions = {
                tp: min(self._open[tp]) if self._open.get(tp) else end
                for tp, end in self._next.items()
            }
            return {tp: at for tp, at in positions.items() if self._committed.get(tp) != at}

    def committed(self, positions: dict[TopicPartition, int]) -> None:
        with self._lock:
            self._committed.update(positions)
