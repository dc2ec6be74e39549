"""Replay in a pool of processes rebuilds exactly what one process rebuilds."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from processor.config.settings import default_of
from processor.engine.loop import LoopConfig, ProcessorLoop
from processor.facts.keyring import KeyRing
from processor.facts.models import RunSucceeded
from processor.facts.topics import TopicName
from processor.restore.parallel import catch_up_partitions, worker_count
from processor.restore.replay import replay
from processor.store.rocks import COLUMN_FAMILIES, PartitionStore
from processor.transport.base import Reader, TopicPartition, ValueBatch
from tests.apps.support import LoopHarness, wait_until

RUNS = 24


def _rows(root: Path, partitions: int) -> dict[tuple[int, str], list[tuple[bytes, bytes]]]:
    rows = {}
    for partition in range(partitions):
        store = PartitionStore(root / f"p{partition:04d}", read_only=True)
        try:
            for family in COLUMN_FAMILIES:
                rows[partition, family] = list(store.items(family))
        finally:
            store.close()
    return rows


def test_processes_rebuild_the_same_stores_as_one_process(
    harness: LoopHarness, tmp_path: Path
) -> None:
    run_ids = _all_succeed(harness)
    deployment = harness.deployment
    partitions = deployment.topology.partitions
    facts = sum(len(harness.facts(r)) for r in run_ids)

    reports = {}
    for processes in (1, 2):
        target = tmp_path / f"replayed-{processes}"
        reports[processes] = replay(
            deployment.transport,
            deployment.topology,
            deployment.settings.state_dir,
            verify=True,
            target_dir=target,
            processes=processes,
        )
    for report in reports.values():
        assert report.verified is True, report.differences
        assert (report.facts, report.runs) == (facts, RUNS)
    assert [reports[n].processes for n in (1, 2)] == [1, 2]
    one, two = (_rows(tmp_path / f"replayed-{n}", partitions) for n in (1, 2))
    assert sum(len(rows) for (_, family), rows in one.items() if family == "runs") == RUNS
    assert two == one


def test_replay_counts_the_runs_it_rebuilt_and_those_a_target_held(
    harness: LoopHarness, tmp_path: Path
) -> None:
    """Without --verify, a fresh store's runs are the runs its catch-up saw begin (no
    scan); a target that holds stores already is caught up from where they are, and
    its runs are counted by a scan, not only the ones that began this time."""
    run_ids = _all_succeed(harness)
    deployment = harness.deployment
    facts = sum(len(harness.facts(r)) for r in run_ids)
    for processes in (1, 2):
        target = tmp_path / f"replayed-{processes}"
        args = (deployment.transport, deployment.topology, deployment.settings.state_dir)
        fresh = replay(*args, target_dir=target, processes=processes)
        assert (fresh.facts, fresh.runs) == (facts, RUNS)
        again = replay(*args, target_dir=target, processes=processes)
        assert (again.facts, again.runs) == (0, RUNS)


def test_progress_reaches_the_total_with_every_process(
    harness: LoopHarness, tmp_path: Path
) -> None:
    run_ids = _all_succeed(harness)
    deployment = harness.deployment
    facts = sum(len(harness.facts(r)) for r in run_ids)
    totals: list[int] = []
    advanced: list[int] = []

    def progress_total(total: int) -> Callable[[int], None]:
        totals.append(total)
        return advanced.append

    args = (deployment.transport, deployment.topology, deployment.settings.state_dir)
    target = tmp_path / "replayed"
    report = replay(*args, target_dir=target, progress_total=progress_total, processes=2)
    assert report.processes == 2
    assert totals == [facts]  # the embedded log has no transaction markers
    assert sum(advanced) == facts  # the pool's partitions included

    more = _all_succeed(harness)  # a target holding stores resumes from their offsets
    advanced.clear()
    again = replay(*args, target_dir=target, progress_total=progress_total, processes=2)
    new_facts = sum(len(harness.facts(r)) for r in more)
    assert (again.facts, totals[1], sum(advanced)) == (new_facts, new_facts, new_facts)


def test_the_next_read_starts_before_the_last_store_is_persisted(
    harness: LoopHarness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partitions caught up in turn overlap: the next one's read is started (on Kafka
    its first fetch is then in flight) before the last store is persisted."""
    _all_succeed(harness)
    deployment = harness.deployment
    facts_topic = deployment.topology.name(TopicName.FACTS)
    events: list[str] = []
    persist = PartitionStore.persist

    def recorded_persist(store: PartitionStore) -> None:
        events.append(f"persist {store.path.name}")
        persist(store)

    monkeypatch.setattr(PartitionStore, "persist", recorded_persist)
    reader = _RecordingReader(deployment.transport.reader(), events)
    partitions = range(deployment.topology.partitions)
    ends = {p: reader.end_offset(TopicPartition(facts_topic, p)) for p in partitions}
    assert all(ends.values())
    try:
        catch_up_partitions(deployment.transport, reader, facts_topic, tmp_path, ends, processes=1)
    finally:
        reader.close()
    expected = ["read p0000"]
    for p in partitions[1:]:
        expected += [f"read p{p:04d}", f"persist p{p - 1:04d}"]
    assert events == [*expected, f"persist p{partitions[-1]:04d}"]


class _RecordingReader:
    """A reader that notes each read it starts."""

    def __init__(self, reader: Reader, events: list[str]) -> None:
        self._reader, self._events = reader, events
        self.end_offset, self.close = reader.end_offset, reader.close

    def read_values(
        self, tp: TopicPartition, start: int, end: int | None = None, batch_size: int = 10_000
    ) -> Iterator[ValueBatch]:
        self._events.append(f"read p{tp.partition:04d}")
        return self._reader.read_values(tp, start, end, batch_size)


def test_by_default_only_big_catch_ups_start_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    PARALLEL_MIN_FACTS = default_of("parallel_restore_min_facts")  # noqa: N806
    assert PARALLEL_MIN_FACTS == 200_000
    assert worker_count(None, PARALLEL_MIN_FACTS - 1, 4) == 1
    assert worker_count(None, PARALLEL_MIN_FACTS, 4) == 2
    assert worker_count(None, PARALLEL_MIN_FACTS, 1) == 1  # one partition: one process
    assert worker_count(None, 10, 4, min_facts=10) == 2
    assert worker_count(3, 10, 4) == 3
    with pytest.raises(ValueError, match="at least one process"):
        worker_count(0, PARALLEL_MIN_FACTS, 4)


def test_a_lost_store_of_several_partitions_is_restored_in_processes(
    harness: LoopHarness, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_ids = _all_succeed(harness)
    deployment = harness.deployment
    settings = deployment.settings
    harness.loop.close()
    shutil.rmtree(settings.state_dir)  # every partition's store is lost

    config = dataclasses.replace(
        LoopConfig.from_settings(
            settings, instance_id="processor-1", resume_keys=KeyRing.single(b"")
        ),
        parallel_restore_min_facts=1,
    )
    loop = ProcessorLoop(
        deployment.transport, harness.app, deployment.topology, config, clock=harness.clock
    )
    caplog.set_level(logging.INFO, logger="processor.restore.assignment")
    try:
        loop.start()

        def restored() -> bool:
            loop.run_once()
            return all(loop.run_state(r) is not None for r in run_ids)

        wait_until(restored, 60, "the partitions to be restored")
        assert all(loop.run_state(r).status == "succeeded" for r in run_ids)  # type: ignore[union-attr]
        assert re.search(r"restoring \d+ facts of partitions [\d, ]+ in 2 processes", caplog.text)
    finally:
        loop.close()
    report = replay(deployment.transport, deployment.topology, settings.state_dir, verify=True)
    assert report.verified is True, report.differences
    assert report.runs == RUNS


def _all_succeed(harness: LoopHarness) -> list[str]:
    """Submit RUNS runs over every partition and drive them all to success."""
    run_ids = [harness.submit("patient", {"x": n}) for n in range(RUNS)]
    pending = set(run_ids)

    def all_succeeded() -> bool:
        for item in harness.new_work():
            harness.complete(item)
        pending.difference_update(
            r for r in list(pending) if any(isinstance(f, RunSucceeded) for f in harness.facts(r))
        )
        return not pending

    harness.drive(all_succeeded, "every run succeeds")
    return run_ids
