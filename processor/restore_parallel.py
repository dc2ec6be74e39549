"""Catch up several partition stores at once, each in a process of its own.

Partitions are independent (one store each, folded from its own runs.facts
partition), and folding is CPU-bound Python, so a pool of processes catches up
N partitions about N times faster on N cores than one process does in turn.
Replay uses it for every rebuild it is asked for, and the processor for a big
restore on assignment (a lost store, or an instance taking partitions over).

Each pool process opens its own reader from the pickled transport, and the store
directory itself; the caller must not hold those stores open meanwhile.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from processor.restore import catch_up
from processor.store.rocks import open_store, store_path
from processor.transport.base import Reader, TopicPartition, Transport

__all__ = ["PARALLEL_MIN_FACTS", "catch_up_partitions", "worker_count"]

logger = logging.getLogger(__name__)

Progress = Callable[[int], None]

#: Below this many facts to fold, partitions are caught up in the calling process:
#: starting a pool process (a fresh interpreter importing the package) costs about
#: a second.
PARALLEL_MIN_FACTS = 200_000
#: Facts per batch here: bigger than a live restore's, since these catch-ups run in a
#: replay or in pool processes whose memory is returned when they end. A run touched
#: by fewer batches is written fewer times (about 10 % faster than 10,000).
BATCH_FACTS = 40_000


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
) -> tuple[dict[int, int], int]:
    """Catch the store of each partition under ``root`` up to its end offset.

    Returns the facts folded per partition and the number of processes used. With
    one process (or a transport that cannot be sent to another process) ``reader``
    catches the partitions up here, in turn; otherwise a pool does, and progress
    advances a partition at a time. ``native``: fold with the compiled fold if it is
    installed (``restore.catch_up``).
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
    context = multiprocessing.get_context("spawn")  # no client threads inherited by a fork
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = {
            partition: pool.submit(
                _catch_up_in_process, shipped, facts_topic, root, partition, end, native=native
            )
            for partition, end in ends.items()
        }
        folded = {}
        for partition, future in futures.items():
            folded[partition] = future.result()
            if advance is not None:
                advance(folded[partition])
    return folded, workers


def _catch_up(
    reader: Reader,
    facts_topic: str,
    root: Path,
    partition: int,
    end: int,
    *,
    advance: Progress | None = None,
    native: bool = True,
) -> int:
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
) -> int:
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
