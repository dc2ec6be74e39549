"""Replay in a pool of processes rebuilds exactly what one process rebuilds."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from processor.facts.models import RunSucceeded
from processor.replay import PARALLEL_MIN_FACTS, _workers, replay
from processor.store.rocks import COLUMN_FAMILIES, PartitionStore
from tests.apps.support import LoopHarness

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
    run_ids = [harness.submit("patient", {"x": n}) for n in range(RUNS)]
    for item in harness.drive(lambda: harness.new_work() or None, "attempts are dispatched"):
        harness.complete(item)
    pending = set(run_ids)

    def all_succeeded() -> bool:
        for item in harness.new_work():
            harness.complete(item)
        pending.difference_update(
            r for r in list(pending) if any(isinstance(f, RunSucceeded) for f in harness.facts(r))
        )
        return not pending

    harness.drive(all_succeeded, "every run succeeds")
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


def test_by_default_only_big_replays_start_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    small = dict.fromkeys(range(4), PARALLEL_MIN_FACTS // 8)
    big = dict.fromkeys(range(4), PARALLEL_MIN_FACTS // 2)
    assert _workers(None, small) == 1
    assert _workers(None, big) == 2
    assert _workers(None, {0: PARALLEL_MIN_FACTS}) == 1  # one partition: one process
    assert _workers(3, small) == 3
    with pytest.raises(ValueError, match="at least one process"):
        _workers(0, big)
