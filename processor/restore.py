"""Bring a partition store up to date from runs.facts (restore, catch-up and replay)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NamedTuple

from processor.facts.codec import decode_facts
from processor.gc_pause import gc_paused
from processor.store.native_fold import NativeFold, native_fold_available
from processor.store.rocks import PartitionStore
from processor.store.staging import Staging
from processor.transport.base import Reader, TopicPartition

__all__ = ["CaughtUp", "catch_up"]

logger = logging.getLogger(__name__)


class CaughtUp(NamedTuple):
    """What a catch-up folded: facts, and runs that began (were not in the store)."""

    facts: int
    runs_started: int


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
    """Fold every committed fact after the store's offset into it; return how many,
    and how many runs began (so a fresh store's runs are counted without a scan).

    Each read batch is written in one WriteBatch with the offset after its last
    fact, without the write-ahead log (a bulk load); the store is persisted at the
    end, and RocksDB's atomic flushes keep every column family at one batch, so a
    crash mid-way resumes where the last flushed batch ended. With ``native``
    (and the extension installed), batches are folded by the compiled fold
    (``store/native_fold.py``), any batch it declines by the Python reducers.
    """
    start = store.facts_offset()
    if end is not None and start >= end:
        return CaughtUp(0, 0)
    # The only writer of ``store`` while catching up: carry each batch's runs to the next.
    staging = Staging(store, carry=True)
    compiled = NativeFold(store) if native and native_fold_available() else None
    applied = in_python = started_in_python = 0
    for values, next_offset in reader.read_values(facts, start, end, batch_size=batch_size):
        with gc_paused():
            if compiled is not None and compiled.fold(values, next_offset):
                staging.discard()  # its carried runs are stale now
            else:
                if compiled is not None:
                    compiled.reset()  # Python writes this batch: the kernel's runs go stale
                    in_python += 1
                # Decode the whole batch first (a bad fact raises before anything is
                # staged: nothing of this batch is written), then fold it in one go.
                present = [value for value in values if value is not None]
                staging.fold_read(list(zip(decode_facts(present), present, strict=True)))
                started_in_python += staging.flush(next_offset, wal=False)
        applied += len(values)
        if progress is not None:
            progress(len(values))
    if applied:
        store.persist()  # before anything is written with the log on top of this
        logger.info(
            "partition %s: caught up %d facts from offset %d%s",
            facts.partition,
            applied,
            start,
            f" ({in_python} batches declined by the compiled fold)" if in_python else "",
        )
    started = started_in_python + (compiled.runs_started if compiled is not None else 0)
    return CaughtUp(applied, started)
