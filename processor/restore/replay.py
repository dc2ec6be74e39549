"""Rebuild projections from runs.facts into a fresh store, and verify them.

Partitions are independent, so they are rebuilt by a pool of processes
(``restore_parallel``): by default one per CPU (at most one per partition) for a
replay big enough to pay for starting them.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path

from processor.config.settings import default_of
from processor.facts.topics import TopicName
from processor.restore.malloc_tuning import keep_freed_memory
from processor.restore.parallel import catch_up_partitions, worker_count
from processor.store.native_fold import native_fold_available
from processor.store.rocks import (
    COLUMN_FAMILIES,
    PartitionStore,
    open_existing,
    store_path,
    stored_facts_offset,
)
from processor.transport.base import Reader, TopicPartition, Transport
from processor.transport.topology import Topology

__all__ = ["ReplayReport", "replay"]

logger = logging.getLogger(__name__)

Progress = Callable[[int], None]


@dataclass
class ReplayReport:
    facts: int = 0
    runs: int = 0
    seconds: float = 0.0
    processes: int = 1  # processes that rebuilt the partitions
    compiled_fold: bool = False  # folded with processor_native (store/native_fold.py)
    verified: bool | None = None
    differences: list[str] = field(default_factory=list)

    @property
    def facts_per_s(self) -> float:
        return self.facts / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "facts": self.facts,
            "runs": self.runs,
            "seconds": round(self.seconds, 3),
            "processes": self.processes,
            "compiled_fold": self.compiled_fold,
            "facts_per_s": round(self.facts_per_s, 1),
            "verified": self.verified,
            "differences": self.differences[:20],
        }


def replay(
    transport: Transport,
    topology: Topology,
    live_state_dir: Path,
    *,
    verify: bool = False,
    target_dir: Path | None = None,
    progress_total: Callable[[int], Progress] | None = None,
    processes: int | None = None,
    native_fold: bool = default_of("native_fold"),
) -> ReplayReport:
    """Fold runs.facts of every partition into fresh stores under ``target_dir``.

    With ``verify``, each partition is rebuilt up to exactly the offset the live
    store has applied, then every column family is compared row by row.
    With ``processes > 1``, up to that many partitions are rebuilt at once, each
    in a process of its own (the pool's progress is passed on every half second);
    a transport that cannot be sent to another process is rebuilt here, in turn.
    ``None`` picks: one per CPU for ``Settings.parallel_restore_min_facts`` facts or more, else 1
    (``restore_parallel.worker_count``). ``native_fold``: fold with the compiled
    fold when it is installed (``store/native_fold.py``).

    The calling process keeps the memory it frees from then on (``malloc_tuning``),
    as the catch-up pool's processes do: call it from a process that ends with the
    replay or does not mind its RSS staying at its peak (the CLI, the demo).
    """
    report = ReplayReport(compiled_fold=native_fold and native_fold_available())
    keep_freed_memory()  # a replay is a bulk load: see ``malloc_tuning``
    facts_topic = topology.name(TopicName.FACTS)
    reader = transport.reader()
    scratch = target_dir is None
    root = Path(tempfile.mkdtemp(prefix="processor-replay-")) if target_dir is None else target_dir
    # Read-only handles are consistent snapshots: each live store's offset and rows
    # are taken at one instant, even while the processor keeps committing.
    live = (
        {p: open_existing(store_path(live_state_dir, p)) for p in range(topology.partitions)}
        if verify
        else {}
    )
    try:
        ends = {
            p: _end(reader, TopicPartition(facts_topic, p), live.get(p), verify)
            for p in range(topology.partitions)
        }
        # A target that holds stores already is caught up from where they are; their
        # runs are counted by a scan. A fresh store's runs are the runs that began.
        starts = {p: stored_facts_offset(store_path(root, p)) for p in ends}
        resumed = {p for p, start in starts.items() if start > 0}
        to_read = sum(max(0, ends[p] - starts[p]) for p in ends)
        advance = progress_total(to_read) if progress_total else None
        started = time.perf_counter()
        workers = worker_count(processes, sum(ends.values()), len(ends))
        folded, report.processes = catch_up_partitions(
            transport,
            reader,
            facts_topic,
            root,
            ends,
            processes=workers,
            advance=advance,
            native=native_fold,
        )
        for partition, caught in folded.items():
            report.facts += caught.facts
            if partition not in resumed and not verify:
                report.runs += caught.runs_started
                continue
            fresh = PartitionStore(store_path(root, partition))
            try:
                report.runs += fresh.count("runs")
                if verify:
                    report.differences.extend(_compare(fresh, live.get(partition), partition))
            finally:
                fresh.close()
        report.seconds = time.perf_counter() - started
        if verify:
            report.verified = not report.differences
    finally:
        reader.close()
        for store in live.values():
            if store is not None:
                store.close()
        if scratch:
            shutil.rmtree(root, ignore_errors=True)
    return report


def _end(reader: Reader, tp: TopicPartition, live: PartitionStore | None, verify: bool) -> int:
    """Where to stop: the live store's applied offset when verifying, else the log's end."""
    if not verify:
        return reader.end_offset(tp)
    return 0 if live is None else live.facts_offset()


def _compare(fresh: PartitionStore, live: PartitionStore | None, partition: int) -> Iterator[str]:
    if live is None:
        if fresh.count("runs"):
            yield f"p{partition}: no live store, but facts exist"
        return
    for family in COLUMN_FAMILIES:
        if family == "meta":
            continue
        yield from _compare_family(family, partition, fresh, live)
    yield from _compare_histories(partition, fresh, live)
    if fresh.facts_offset() != live.facts_offset():
        yield f"p{partition}: facts offset {fresh.facts_offset()} != live {live.facts_offset()}"


def _compare_family(
    family: str, partition: int, fresh: PartitionStore, live: PartitionStore
) -> Iterator[str]:
    if family == "history":
        return  # chunked by write: compared run by run (``_compare_histories``)
    for rebuilt, current in zip_longest(fresh.items(family), live.items(family)):
        if rebuilt != current:
            yield (f"p{partition} {family}: rebuilt {_show(rebuilt)} != live {_show(current)}")
            return  # one difference per family is enough to act on


def _compare_histories(
    partition: int, fresh: PartitionStore, live: PartitionStore
) -> Iterator[str]:
    """Each run's facts, whatever the chunks: live ones follow the loop's commits,
    rebuilt ones the catch-up batches."""
    for rebuilt, current in zip_longest(fresh.histories(), live.histories()):
        if rebuilt != current:
            yield f"p{partition} history: rebuilt {_show_run(rebuilt)} != live {_show_run(current)}"
            return


def _show_run(history: tuple[str, list[bytes]] | None) -> str:
    if history is None:
        return "<missing>"
    run_id, facts = history
    return f"{run_id[:60]!r}: {len(facts)} facts, the last {facts[-1][:120]!r}"


def _show(row: tuple[bytes, bytes] | None) -> str:
    if row is None:
        return "<missing>"
    key, value = row
    return f"{key[:60]!r}={value[:120]!r}"
