"""Catch up several partition stores at once, each in a process of its own.

Partitions are independent (one store each, folded from its own runs.facts
partition), and folding is CPU-bound Python, so a pool of processes catches up
N partitions about N times faster on N cores than one process does in turn.
Replay uses it for every rebuild it is asked for, and the processor for a big
restore on assignment (a lost store, or an instance taking partitions over).

The calling process catches partitions up too, from the front of the list, while
the pool takes them from the back. Each pool process opens its own reader from the
pickled transport, and the store directory itself; the caller must not hold those
stores open meanwhile.
"""

from __future__ import annotations

import collections
import functools
import logging
import multiprocessing
import os
import pickle
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from multiprocessing.synchronize import Event as ProcessEvent
from pathlib import Path

from processor.malloc_tuning import keep_freed_memory
from processor.restore import CaughtUp, catch_up
from processor.store.rocks import open_store, store_path
from processor.transport.base import Reader, TopicPartition, Transport

__all__ = ["PARALLEL_MIN_FACTS", "catch_up_partitions", "worker_count"]

logger = logging.getLogger(__name__)

Progress = Callable[[int], None]

#: Below this many facts to fold, partitions are caught up in the calling process:
#: starting a pool (a fresh interpreter importing the package) costs about half a
#: second.
PARALLEL_MIN_FACTS = 200_000
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
    processes: int | None, facts: int, partitions: int, *, min_facts: int = PARALLEL_MIN_FACTS
) -> int:
    """How many processes to use: ``processes`` if given, else one per CPU (at most one
    per partition) for ``min_facts`` facts or more, else 1."""
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
    process and a pool of ``processes - 1`` share them, and progress advances a
    partition at a time for those the pool caught up. ``native``: fold with the
    compiled fold if it is installed (``restore.catch_up``).
    """
    shipped = _shippable(transport) if processes > 1 and len(ends) > 1 else None
    if shipped is None:
        serial = {
            partition: _catch_up(
                reader, facts_topic, root, partition, end, advance=advance, native=native
            )
            for partition, end in ends.items()
        }
        return serial, 1
    workers = min(processes, len(ends))
    left = _Partitions(ends)
    in_pool = functools.partial(_catch_up_in_process, shipped, facts_topic, root, native=native)
    pool = _PoolFeeder(
        workers - 1, _context(transport), left, catch_up_one=in_pool, ends=ends, advance=advance
    )
    pool.start()
    pool.wait_started()
    folded: dict[int, CaughtUp] = {}
    try:
        while (partition := left.take(back=False)) is not None:
            folded[partition] = _catch_up(
                reader,
                facts_topic,
                root,
                partition,
                ends[partition],
                advance=advance,
                native=native,
            )
    finally:
        left.clear()  # after a failure here, the pool starts nothing more
        pool.join()
    return {**folded, **pool.result()}, workers


class _Partitions:
    """The partitions no process has started: this process takes them from the
    front, the pool from the back."""

    def __init__(self, partitions: Iterable[int]) -> None:
        self._left = collections.deque(partitions)
        self._lock = threading.Lock()

    def take(self, *, back: bool) -> int | None:
        with self._lock:
            if not self._left:
                return None
            return self._left.pop() if back else self._left.popleft()

    def clear(self) -> None:
        with self._lock:
            self._left.clear()


class _PoolFeeder(threading.Thread):
    """Keeps ``size`` pool processes busy with partitions taken from ``left``."""

    def __init__(
        self,
        size: int,
        context: multiprocessing.context.BaseContext,
        left: _Partitions,
        *,
        catch_up_one: Callable[[int, int], CaughtUp],
        ends: dict[int, int],
        advance: Progress | None,
    ) -> None:
        super().__init__(name="catch-up-pool", daemon=True)
        self._size, self._context, self._left = size, context, left
        self._catch_up_one, self._ends, self._advance = catch_up_one, ends, advance
        self._folded: dict[int, CaughtUp] = {}
        self._error: BaseException | None = None
        self._submitted = threading.Event()  # the first partitions went to the pool
        self._up = context.Event()  # a pool process has started

    def wait_started(self) -> None:
        """Let a pool process start before this process starts catching up, when the
        fork server is running already: the feeder thread needs the GIL a few times to
        start it, and the calling thread would hold it in long calls (opening a store,
        RocksDB writes) for ~0.2 s, which the pool process would finish late by. A fork
        server that must start first takes longer than that: this process goes ahead."""
        if self._submitted.wait(_WARM_SUBMIT_S):
            self._up.wait(_POOL_START_S)

    def run(self) -> None:
        try:
            with ProcessPoolExecutor(
                max_workers=self._size,
                mp_context=self._context,
                initializer=_started,
                initargs=(self._up,),
            ) as pool:
                running: dict[Future[CaughtUp], int] = {}
                for _ in range(self._size):
                    self._submit_next(pool, running)
                self._submitted.set()
                while running:
                    finished, _ = wait(running, return_when=FIRST_COMPLETED)
                    for future in finished:
                        partition = running.pop(future)
                        self._folded[partition] = future.result()
                        if self._advance is not None:
                            self._advance(self._folded[partition].facts)
                        self._submit_next(pool, running)
        except BaseException as exc:  # re-raised by ``result`` in the calling thread
            self._left.clear()
            self._error = exc
        finally:
            self._submitted.set()

    def _submit_next(self, pool: ProcessPoolExecutor, running: dict[Future[CaughtUp], int]) -> None:
        partition = self._left.take(back=True)
        if partition is not None:
            future = pool.submit(self._catch_up_one, partition, self._ends[partition])
            running[future] = partition

    def result(self) -> dict[int, CaughtUp]:
        """What the pool folded per partition (after ``join``)."""
        if self._error is not None:
            raise self._error
        return self._folded


def _started(up: ProcessEvent) -> None:
    """A pool process's first act: say it is up (``_PoolFeeder.wait_started``), and
    keep the memory it frees (``malloc_tuning``): it ends when the pool does."""
    keep_freed_memory()
    up.set()


def _context(transport: Transport) -> multiprocessing.context.BaseContext:
    """Pool processes forked from a fork server that has imported the catch-up code,
    the main module and parsed the fact schemas once (a fork of this process could
    inherit client threads; a spawned process imports everything again: ~0.4 s of CPU
    each). Without ``__main__`` preloaded, every pool process would import the main
    module itself (the CLI: ~0.08 s of CPU, before it starts catching up)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    preload = ["__main__", __name__, type(transport).__module__, "processor.pool_preload"]
    context.set_forkserver_preload(preload)
    return context


def _catch_up(
    reader: Reader,
    facts_topic: str,
    root: Path,
    partition: int,
    end: int,
    *,
    advance: Progress | None = None,
    native: bool = True,
) -> CaughtUp:
    store = open_store(store_path(root, partition))
    try:
        return catch_up(
            store,
            reader,
            TopicPartition(facts_topic, partition),
            end=end,
            batch_size=BATCH_FACTS,
            progress=advance,
            native=native,
        )
    finally:
        store.close()


def _catch_up_in_process(
    shipped: bytes, facts_topic: str, root: Path, partition: int, end: int, *, native: bool
) -> CaughtUp:
    """``_catch_up`` in a pool process, with a reader of its own."""
    transport: Transport = pickle.loads(shipped)
    reader = transport.reader()
    try:
        return _catch_up(reader, facts_topic, root, partition, end, native=native)
    finally:
        reader.close()


def _shippable(transport: Transport) -> bytes | None:
    """``transport`` pickled for a pool process, or None if it cannot be."""
    try:
        return pickle.dumps(transport)
    except Exception as exc:  # any object may refuse pickling in its own way
        logger.info("transport cannot go to other processes (%s); catching up here", exc)
        return None
