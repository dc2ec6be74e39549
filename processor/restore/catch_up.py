"""Bring a partition store up to date from runs.facts (restore, catch-up and replay)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import NamedTuple

from processor.facts.codec import decode_facts
from processor.store.native_fold import NativeFold, native_fold_available
from processor.store.rocks import PartitionStore
from processor.store.staging import Staging
from processor.transport.base import Reader, TopicPartition, ValueBatch
from processor.transport.gc_pause import gc_paused

__all__ = ["CaughtUp", "PartitionCatchUp", "catch_up"]

logger = logging.getLogger(__name__)


class CaughtUp(NamedTuple):
    """What a catch-up folded: facts, and runs that began (were not in the store)."""

    facts: int
    runs_started: int


class PartitionCatchUp:
    """One store's catch-up, in two steps: ``fold`` every committed fact after the
    store's offset into it, then ``persist`` it.

    The read starts when this is made: on Kafka the first fetch is in flight from
    then on (a full fetch takes a tenth of a second or more to arrive), so whoever
    catches several partitions up in turn makes the next one's before persisting the
    last one (``restore_parallel``).

    Each read batch is written in one WriteBatch with the offset after its last
    fact, without the write-ahead log (a bulk load); ``persist`` flushes the store,
    and RocksDB's atomic flushes keep every column family at one batch, so a crash
    mid-way resumes where the last flushed batch ended. With ``native`` (and the
    extension installed), batches are folded by the compiled fold
    (``store/native_fold.py``), any batch it declines by the Python reducers.
    """

    def __init__(
        self,
        store: PartitionStore,
        reader: Reader,
        facts: TopicPartition,
        *,
        end: int | None = None,
        batch_size: int = 10_000,
    ) -> None:
        self.store, self.facts, self._end = store, facts, end
        self.start = store.facts_offset()
        nothing_to_read = end is not None and self.start >= end
        self._batches: Iterable[ValueBatch] = (
            () if nothing_to_read else reader.read_values(facts, self.start, end, batch_size)
        )
        self._caught = CaughtUp(0, 0)
        self._in_python = 0  # batches the compiled fold declined

    def fold(
        self, *, progress: Callable[[int], None] | None = None, native: bool = True
    ) -> CaughtUp:
        """Fold every batch read into the store; return how many facts, and how many
        runs began (so a fresh store's runs are counted without a scan).

        ``progress`` is called with the offsets each batch moved past; with an ``end``,
        they add up to ``end`` minus the start (transaction markers included)."""
        store = self.store
        position = self.start
        # The only writer of ``store`` while catching up: carry each batch's runs to the next.
        staging = Staging(store, carry=True)
        compiled = NativeFold(store) if native and native_fold_available() else None
        applied = started_in_python = 0
        for values, next_offset in self._batches:
            with gc_paused():
                if compiled is not None and compiled.fold(values, next_offset):
                    staging.discard()  # its carried runs are stale now
                else:
                    if compiled is not None:
                        compiled.reset()  # Python writes this batch: the kernel's runs go stale
                        self._in_python += 1
                    # Decode the whole batch first (a bad fact raises before anything is
                    # staged: nothing of this batch is written), then fold it in one go.
                    present = [value for value in values if value is not None]
                    staging.fold_read(list(zip(decode_facts(present), present, strict=True)))
                    started_in_python += staging.flush(next_offset, wal=False)
            applied += len(values)
            if progress is not None:
                progress(next_offset - position)
            position = next_offset
        if progress is not None and self._end is not None and position < self._end:
            progress(self._end - position)  # past the last fact: transaction markers
        started = started_in_python + (compiled.runs_started if compiled is not None else 0)
        self._caught = CaughtUp(applied, started)
        return self._caught

    def persist(self) -> None:
        """Make what ``fold`` wrote durable (before anything is written with the log on
        top of it)."""
        if not self._caught.facts:
            return
        self.store.persist()
        logger.info(
            "partition %s: caught up %d facts from offset %d%s",
            self.facts.partition,
            self._caught.facts,
            self.start,
            f" ({self._in_python} batches declined by the compiled fold)"
            if self._in_python
            else "",
        )


def catch_up(
    store: PartitionStore,
    reader: Reader,
    facts: TopicPartition,
    *,
    end: int | None = None,
    batch_size: int = 10_000,
    progress: Callable[[int], None] | None = None,
    native: bool = True,
) -> CaughtUp:
    """Fold every committed fact after the store's offset into it and persist it; return
    how many facts, and how many runs began (``PartitionCatchUp``)."""
    step = PartitionCatchUp(store, reader, facts, end=end, batch_size=batch_size)
    caught = step.fold(progress=progress, native=native)
    step.persist()
    return caught
