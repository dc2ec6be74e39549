"""Catch up several partition stores at once, each in a process of its own.

Partitions are independent (one store each, folded from its own runs.facts
partition), and folding is CPU-bound Python, so a pool of processes catches up
N partitions about N times faster on N cores than one process does in turn.
Replay uses it for every rebuild it is asked for, and the processor for a big
restore on assignment (a lost store, or an instance taking partitions over).

The calling process catches partitions up too, from the front of the list, while
the pool's processes take them from the back (the list is in shared memory). Each
process catches its partitions up in turn with one reader, and starts the next
partition's read before it persists the last one's store, so that the first fetch
arrives meanwhile. Each pool process opens its reader from the pickled transport,
and the store directories itself; the caller must not hold those stores open
meanwhile.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import pickle
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event as ProcessEvent
from pathlib import Path
from typing import NamedTuple

from processor.config.settings import default_of
from processor.restore.catch_up import CaughtUp, PartitionCatchUp
from processor.restore.malloc_tuning import keep_freed_memory
from processor.store.rocks import open_store, store_path
from processor.transport.base import Reader, TopicPartition, Transport

__all__ = ["catch_up_partitions", "worker_count"]

logger = logging.getLogger(__name__)

Progress = Callable[[int], None]

#: Facts per batch here: bigger than a live restore's, since these catch-ups run in a
#: replay or in pool processes whose memory is returned when they end. A run touched
#: by fewer batches is written fewer times (about 10 % faster than 10,000).
BATCH_FACTS = 40_000
#: A fork server already running hands a partition to a new pool process in ~20 ms;
#: one that must start first takes ~0.5 s.
_WARM_SUBMIT_S = 0.05
#: How long the calling process then waits for the pool process to be up.
_POOL_START_S = 0.25


def worker_count(
    processes: int | None,
    facts: int,
    partitions: int,
    *,
    min_facts: int = default_of("parallel_restore_min_facts"),
) -> int:
    """How many processes to use: ``processes`` if given, else one per CPU (at most one
    per partition) for ``min_facts`` facts or more, else 1.

    Below ``min_facts`` (``Settings.parallel_restore_min_facts``) partitions are caught
    up in the calling process: starting a pool (a fresh interpreter importing the
    package) costs about half a second.
    """
    if processes is not None:
        if processes < 1:
            raise ValueError(f"catching up needs at least one process, got {processes}")
        return processes
    if facts < min_facts:
        return 1
    return max(1, min(os.cpu_count() or 1, partitions))


def catch_up_partitions(
    transport: Transport,
    reader: Reader,
    facts_topic: str,
    root: Path,
    ends: dict[int, int],
    *,
    processes: int,
    advance: Progress | None = None,
    native: bool = True,
) -> tuple[dict[int, CaughtUp], int]:
    """Catch the store of each partition under ``root`` up to its end offset.

    Returns what was folded per partition (facts, runs begun) and the number of
    processes used. With one process (or a transport that cannot be sent to another
    process) ``reader`` catches the partitions up here, in turn; otherwise this
    process and a pool of ``processes - 1`` share them. ``advance`` is called with
    the offsets caught up, batch by batch (every ``_PROGRESS_S`` for the pool's),
    adding up to the ends minus the stores' offsets. ``native``:
    fold with the compiled fold if it is installed (``restore.PartitionCatchUp``).
    """
    job = _Job(facts_topic, root, ends, native)
    shipped = _shippable(transport) if processes > 1 and len(ends) > 1 else None
    if shipped is None:
        in_order = iter(ends)
        return _catch_up_in_turn(reader, job, lambda: next(in_order, None), advance=advance), 1
    workers = min(processes, len(ends))
    context = _context(transport)
    left = _Partitions(ends, context)
    pool = _PoolFeeder(workers - 1, context, left, shipped=shipped, job=job, advance=advance)
    pool.start()
    pool.wait_started()
    try:
        folded = _catch_up_in_turn(
            reader, job, functools.partial(left.take, back=False), advance=advance
        )
    finally:
        left.clear()  # after a failure here, the pool starts nothing more
        pool.join()
    return {**folded, **pool.result()}, workers


class _Job(NamedTuple):
    """What every process catching up needs to know: where the facts are, where the
    stores go, where each partition ends, and how to fold."""

    facts_topic: str
    root: Path
    ends: dict[int, int]
    native: bool


def _catch_up_in_turn(
    reader: Reader, job: _Job, take: Callable[[], int | None], *, advance: Progress | None
) -> dict[int, CaughtUp]:
    """Catch up the partitions ``take`` hands out, one after another, with ``reader``.

    Each next partition's store is opened and its read started (its first fetch in
    flight) before the last one's store is persisted and closed.
    """
    folded: dict[int, CaughtUp] = {}
    upcoming = _start(reader, job, take())
    while upcoming is not None:
        current, upcoming = upcoming, None
        try:
            folded[current.facts.partition] = current.fold(progress=advance, native=job.native)
            upcoming = _start(reader, job, take())
            current.persist()
        except BaseException:
            if upcoming is not None:
                upcoming.store.close()
            raise
        finally:
            current.store.close()
    return folded


def _start(reader: Reader, job: _Job, partition: int | None) -> PartitionCatchUp | None:
    """Open the store of ``partition`` and start its read (None for no partition)."""
    if partition is None:
        return None
    store = open_store(store_path(job.root, partition))
    try:
        return PartitionCatchUp(
            store,
            reader,
            TopicPartition(job.facts_topic, partition),
            end=job.ends[partition],
            batch_size=BATCH_FACTS,
        )
    except BaseException:
        store.close()
        raise


class _Partitions:
    """The partitions no process has started, in memory shared with the pool's
    processes: the calling process takes them from the front, the pool's from the back."""

    def __init__(
        self, partitions: Iterable[int], context: multiprocessing.context.BaseContext
    ) -> None:
        order = list(partitions)
        self._order = context.Array("q", order, lock=False)
        self._bounds = context.Array("q", [0, len(order)])  # [front, back), with a lock

    def take(self, *, back: bool) -> int | None:
        with self._bounds.get_lock():
            front, end = self._bounds[0], self._bounds[1]
            if front >= end:
                return None
            if back:
                self._bounds[1] = end - 1
                return int(self._order[end - 1])
            self._bounds[0] = front + 1
            return int(self._order[front])

    def clear(self) -> None:
        with self._bounds.get_lock():
            self._bounds[0] = self._bounds[1]


class _PoolFeeder(threading.Thread):
    """Runs ``size`` pool processes, each catching up partitions taken from ``left``
    until none are left, and passes on their progress."""

    def __init__(
        self,
        size: int,
        context: multiprocessing.context.BaseContext,
        left: _Partitions,
        *,
        shipped: bytes,
        job: _Job,
        advance: Progress | None,
    ) -> None:
        super().__init__(name="catch-up-pool", daemon=True)
        self._size, self._context, self._left = size, context, left
        self._shipped, self._job, self._advance = shipped, job, advance
        self._folded: dict[int, CaughtUp] = {}
        self._error: BaseException | None = None
        self._submitted = threading.Event()  # the pool's work was handed over
        self._up = context.Event()  # a pool process has started
        self._progress = context.Value("q", 0)  # offsets the pool has caught up
        self._reported = 0

    def wait_started(self) -> None:
        """Let a pool process start before this process starts catching up, when the
        fork server is running already: the feeder thread needs the GIL a few times to
        start it, and the calling thread would hold it in long calls (opening a store,
        RocksDB writes) for ~0.2 s, which the pool process would finish late by. A fork
        server that must start first takes longer than that: this process goes ahead."""
        if self._submitted.wait(_WARM_SUBMIT_S):
            self._up.wait(_POOL_START_S)

    def run(self) -> None:
        pool: ProcessPoolExecutor | None = None
        try:
            pool = ProcessPoolExecutor(
                max_workers=self._size,
                mp_context=self._context,
                initializer=_started,
                initargs=(self._up, self._left, self._progress),
            )
            running = {
                pool.submit(_catch_up_taken, self._shipped, self._job) for _ in range(self._size)
            }
            self._submitted.set()
            while running:
                finished, running = wait(running, timeout=_PROGRESS_S, return_when=FIRST_COMPLETED)
                self._pass_progress_on()
                for future in finished:
                    self._folded.update(future.result())
        except BaseException as exc:  # re-raised by ``result`` in the calling thread
            self._left.clear()
            self._error = exc
        finally:
            self._submitted.set()
            if pool is not None:
                # After a failure, wait until no pool process can hold a store open.
                # Otherwise each task closed its stores before it returned: the
                # processes' exit (~30 ms) need not be waited for.
                pool.shutdown(wait=self._error is not None)

    def _pass_progress_on(self) -> None:
        caught_up = self._progress.value
        if self._advance is not None and caught_up > self._reported:
            self._advance(caught_up - self._reported)
        self._reported = caught_up

    def result(self) -> dict[int, CaughtUp]:
        """What the pool folded per partition (after ``join``)."""
        if self._error is not None:
            raise self._error
        return self._folded


#: How often the pool's progress is passed on.
_PROGRESS_S = 0.5


class _Inherited:
    """What a pool process is handed when it starts (``_started``), shared with the
    calling process: the partitions left, and the offsets the pool has caught up."""

    left: _Partitions | None = None
    progress: Synchronized[int] | None = None


_INHERITED = _Inherited()


def _started(up: ProcessEvent, left: _Partitions, progress: Synchronized[int]) -> None:
    """A pool process's first act: keep what it shares with the calling process, say it
    is up (``_PoolFeeder.wait_started``), and keep the memory it frees
    (``malloc_tuning``): it ends when the pool does."""
    _INHERITED.left, _INHERITED.progress = left, progress
    keep_freed_memory()
    up.set()


def _catch_up_taken(shipped: bytes, job: _Job) -> dict[int, CaughtUp]:
    """In a pool process: catch up partitions taken from the back of the shared list,
    in turn, with a reader of its own, until none are left."""
    left, progress = _INHERITED.left, _INHERITED.progress
    if left is None or progress is None:
        raise RuntimeError("a catch-up pool process was not started by _PoolFeeder")

    def advance(offsets: int) -> None:
        with progress.get_lock():
            progress.value += offsets

    transport: Transport = pickle.loads(shipped)
    reader = transport.reader()
    try:
        return _catch_up_in_turn(
            reader, job, functools.partial(left.take, back=True), advance=advance
        )
    finally:
        reader.close()


def _context(transport: Transport) -> multiprocessing.context.BaseContext:
    """Pool processes forked from a fork server that has imported the catch-up code,
    the main module and parsed the fact schemas once (a fork of this process could
    inherit client threads; a spawned process imports everything again: ~0.4 s of CPU
    each). Without ``__main__`` preloaded, every pool process would import the main
    module itself (the CLI: ~0.08 s of CPU, before it starts catching up)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    preload = ["__main__", __name__, type(transport).__module__, "processor.restore.pool_preload"]
    context.set_forkserver_preload(preload)
    return context


def _shippable(transport: Transport) -> bytes | None:
    """``transport`` pickled for a pool process, or None if it cannot be."""
    try:
        return pickle.dumps(transport)
    except Exception as exc:  # any object may refuse pickling in its own way
        logger.info("transport cannot go to other processes (%s); catching up here", exc)
        return None
