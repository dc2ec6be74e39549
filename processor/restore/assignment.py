"""Restore on assignment: the stores of newly assigned partitions, caught up from runs.facts.

The processor loop calls ``restore_assigned`` when partitions are assigned to it, before
it decides anything for them. In order:

1. wait until each partition of runs.facts has no open transaction: a crashed
   writer's hides the facts committed after it, and a store caught up without them
   would make decisions twice;
2. catch a big restore of several partitions up in a pool of processes
   (``parallel.py``);
3. open each store in turn, catch up what is left here (normally nothing after 2),
   with its progress in the restore metrics, and count its runs (the census).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from processor.restore.catch_up import catch_up
from processor.restore.parallel import catch_up_partitions, worker_count
from processor.store.census import RunCensus
from processor.store.rocks import PartitionStore, open_store, store_path, stored_facts_offset
from processor.store.staging import Staging
from processor.telemetry import metrics
from processor.transport.base import Reader, TopicPartition, Transport

__all__ = ["RestoreConfig", "Restored", "restore_assigned"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RestoreConfig:
    """What a restore needs of the settings (``LoopConfig.restore``)."""

    state_dir: Path
    # How long to wait for a crashed writer's open transaction on runs.facts to end.
    stable_wait_s: float
    # A restore of this many facts or more, of several partitions, runs in processes.
    parallel_min_facts: int
    # Fold with the compiled fold when it is installed (store/native_fold.py).
    native_fold: bool
    # The runs each staging keeps in memory (``Staging``).
    keep_runs: int


@dataclass(frozen=True, slots=True)
class Restored:
    """One partition's store, caught up to the end of its runs.facts partition."""

    partition: int
    staging: Staging
    census: RunCensus  # its runs waiting by target and its Unknown attempts
    applied: int  # the runs.facts offset it has applied


def restore_assigned(
    transport: Transport,
    reader: Reader,
    facts_topic: str,
    config: RestoreConfig,
    partitions: Sequence[int],
) -> Iterator[Restored]:
    """Catch the stores of ``partitions`` up, and yield each, in order, once it is.

    What was yielded is the caller's to close, also when a later partition raises.
    """
    for partition in partitions:
        _wait_stable(reader, TopicPartition(facts_topic, partition), config.stable_wait_s)
    _restore_in_processes(transport, reader, facts_topic, config, partitions)
    for partition in partitions:
        store = open_store(store_path(config.state_dir, partition))
        if store.facts_offset() == 0:
            logger.info("partition %d: no store, rebuilding from runs.facts offset 0", partition)
        applied = _catch_up(store, reader, TopicPartition(facts_topic, partition), config)
        census = RunCensus.count_from(store)
        staging = Staging(store, keep_runs=config.keep_runs, census=census)
        yield Restored(partition, staging, census, applied)


def _wait_stable(reader: Reader, facts: TopicPartition, wait_s: float) -> None:
    if not reader.wait_stable(facts, wait_s):
        logger.warning(
            "partition %d: runs.facts still has an open transaction after %.0fs",
            facts.partition,
            wait_s,
        )


def _catch_up(
    store: PartitionStore, reader: Reader, facts: TopicPartition, config: RestoreConfig
) -> int:
    """Catch ``store`` up to the end of its runs.facts partition, with progress; return
    the offset it has applied."""
    end = reader.end_offset(facts)
    remaining = metrics.RESTORE_REMAINING.labels(str(facts.partition))
    remaining.set(max(0, end - store.facts_offset()))
    caught = catch_up(store, reader, facts, native=config.native_fold, progress=remaining.dec)
    remaining.set(0)
    metrics.RESTORE_FACTS.inc(caught.facts)
    # Caught up to the end, and we are the partition's only writer: all of it is applied.
    return max(end, store.facts_offset())


def _restore_in_processes(
    transport: Transport,
    reader: Reader,
    facts_topic: str,
    config: RestoreConfig,
    partitions: Sequence[int],
) -> None:
    """Catch up a big restore of several partitions in a pool of processes first.

    What is left afterwards (normally nothing) is caught up in turn by the caller. (On
    Kafka the end offset counts transaction markers, so an up-to-date store can look a
    few offsets behind: the threshold is far above that.)
    """
    ends, starts, lag = {}, {}, 0
    for partition in partitions:
        end = reader.end_offset(TopicPartition(facts_topic, partition))
        stored = stored_facts_offset(store_path(config.state_dir, partition))
        if end > stored:
            ends[partition], starts[partition] = end, stored
            lag += end - stored
    workers = worker_count(None, lag, len(ends), min_facts=config.parallel_min_facts)
    if workers < 2:
        return
    logger.info(
        "restoring %d facts of partitions %s in %d processes",
        lag,
        ", ".join(map(str, sorted(ends))),
        workers,
    )
    for partition, end in ends.items():
        metrics.RESTORE_REMAINING.labels(str(partition)).set(end - starts[partition])
    folded, _ = catch_up_partitions(
        transport,
        reader,
        facts_topic,
        config.state_dir,
        ends,
        processes=workers,
        native=config.native_fold,
    )
    for partition, caught in sorted(folded.items()):
        logger.info(
            "partition %s: caught up %d facts from offset %d in a restore process",
            partition,
            caught.facts,
            starts[partition],
        )
