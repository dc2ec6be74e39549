"""The runs index on a live processor, on each transport: listings by every filter,
paging, reading through secondary readers while the loop writes, rebuilt by replay
and checked by ``replay --verify``."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from processor.config.settings import Settings
from processor.facts.topics import TopicName
from processor.model.listing import IndexEntry
from processor.restore.replay import replay
from processor.store.census import RunCensus
from processor.store.listing import RunPage, RunQuery, list_runs
from processor.store.readers import LocalStores, open_readers
from processor.store.rocks import PartitionStore, StoreBatch, store_path
from tests.apps.boundary_pipelines import AWAIT_TIMEOUT_S, app
from tests.apps.support import LoopHarness
from tests.boundaries.conftest import SECRET
from tests.boundaries.test_awaits import completion, finish, run_until_suspended, status

AWAIT_MS = int(AWAIT_TIMEOUT_S * 1000)


def _runs(h: LoopHarness) -> dict[str, tuple[str, str, int]]:
    """Five runs of two pipelines: run id -> (pipeline, status, submitted ms)."""
    failed, _ = run_until_suspended(h, "itemized", {"items": 2})
    h.clock.advance_to(h.clock() + AWAIT_MS + 1)  # its await times out: the run fails
    h.drive(lambda: status(h, failed) == "failed", "the timed-out run to fail")
    waiting_square, _ = run_until_suspended(h, "itemized", {"items": 1})
    h.clock.advance_to(h.clock() + 10)
    waiting_echo, _ = run_until_suspended(h, "scalar", {"n": 1})
    h.clock.advance_to(h.clock() + 10)
    done = []  # two runs submitted in the same millisecond: listed by run id
    for n in (2, 3):
        run_id, (request,) = run_until_suspended(h, "scalar", {"n": n})
        h.produce_model(TopicName.COMPLETIONS, run_id, completion(request, n * 10))
        finish(h, run_id)
        done.append(run_id)
    runs = {}
    for run_id in [failed, waiting_square, waiting_echo, *done]:
        state = h.loop_state(run_id)
        assert state is not None
        runs[run_id] = (state.pipeline, state.status, state.submitted_ms)
    assert sorted(s for _, s, _ in runs.values()) == [
        "failed",
        "running",
        "running",
        "succeeded",
        "succeeded",
    ]
    return runs


def _newest_first(runs: dict[str, tuple[str, str, int]], selected: set[str]) -> list[str]:
    return sorted(selected, key=lambda run_id: (-runs[run_id][2], run_id))


def _pages(stores: list[PartitionStore], query: RunQuery, limit: int) -> list[RunPage]:
    pages = [list_runs(stores, query, None, limit)]
    while pages[-1].next_cursor is not None:
        assert len(pages) < 50
        pages.append(list_runs(stores, query, pages[-1].next_cursor, limit))
    return pages


def _listed(stores: list[PartitionStore], query: RunQuery, limit: int = 2) -> list[str]:
    return [run.run_id for page in _pages(stores, query, limit) for run in page.runs]


@contextmanager
def _readers(state_dir: Path) -> Iterator[list[PartitionStore]]:
    stores = open_readers(state_dir)
    try:
        yield stores
    finally:
        for store in stores:
            store.close()


def test_runs_are_listed_by_every_filter_and_the_index_replays(harness: LoopHarness) -> None:
    h = harness
    state_dir = h.deployment.settings.state_dir
    local = LocalStores(state_dir)  # opened before the loop has any store
    try:
        assert local.refresh() == []
        first = _runs(h)
        stores = local.refresh()
        assert stores
        everything = _listed(stores, RunQuery())
        assert everything == _newest_first(first, set(first))  # each run once, in order
        assert len(_pages(stores, RunQuery(), 2)) == 3
        by = {
            RunQuery(status="failed"): {r for r, (_, s, _) in first.items() if s == "failed"},
            RunQuery(status="succeeded"): {r for r, (_, s, _) in first.items() if s == "succeeded"},
            RunQuery(pipeline="itemized"): {r for r, (p, _, _) in first.items() if p == "itemized"},
            RunQuery(pipeline="scalar", status="running"): {
                r for r, (p, s, _) in first.items() if p == "scalar" and s == "running"
            },
            RunQuery(target="square"): {
                r for r, (p, s, _) in first.items() if p == "itemized" and s == "running"
            },
            RunQuery(target="echo", pipeline="itemized"): set(),
        }
        for query, expected in by.items():
            assert _listed(stores, query) == _newest_first(first, expected), query
        (echo,) = list_runs(stores, RunQuery(target="echo"), None, 10).runs
        assert echo.waiting_on == ("echo",) and echo.phase == "suspended"
        newest = max(t for _, _, t in first.values())
        since = _listed(stores, RunQuery(since_ms=newest))
        assert since == _newest_first(first, {r for r, (_, _, t) in first.items() if t >= newest})
        before = _listed(stores, RunQuery(until_ms=newest))
        assert before == [r for r in everything if r not in since]
        # Readers opened before a run are caught up by a refresh.
        later, _ = run_until_suspended(h, "scalar", {"n": 9})
        assert later not in _listed(stores, RunQuery())
        assert _listed(local.refresh(), RunQuery(status="running"))[0] == later
    finally:
        local.close()
    _replays_and_verifies(h, state_dir, [later, *everything])


def _replays_and_verifies(h: LoopHarness, state_dir: Path, everything: list[str]) -> None:
    deployment = h.deployment
    target = state_dir.parent / "rebuilt"
    report = replay(deployment.transport, deployment.topology, state_dir, target_dir=target)
    assert report.runs == len(everything)
    with _readers(target) as rebuilt:
        assert _listed(rebuilt, RunQuery(), 1) == everything
    report = replay(deployment.transport, deployment.topology, state_dir, verify=True)
    assert report.verified is True, report.differences


def test_verify_finds_a_lost_or_a_wrong_index_row(settings: Settings) -> None:
    h = LoopHarness.for_settings(settings, app, secret=SECRET)
    try:
        run_id, (request,) = run_until_suspended(h, "scalar", {"n": 1})
        h.produce_model(TopicName.COMPLETIONS, run_id, completion(request, 1))
        finish(h, run_id)
        state = h.loop_state(run_id)
        assert state is not None and state.status == "succeeded"
    finally:
        h.close()
    deployment, state_dir = h.deployment, settings.state_dir
    row = IndexEntry("status", ("succeeded",), state.submitted_ms, run_id)
    wrong = IndexEntry("status", ("failed",), state.submitted_ms, run_id)

    def verify_after(change: Callable[[StoreBatch], None]) -> list[str]:
        for partition in range(deployment.topology.partitions):
            store = PartitionStore(store_path(state_dir, partition))
            try:
                if store.run(run_id) is not None:
                    batch = store.batch()
                    change(batch)
                    store.write(batch)
            finally:
                store.close()
        report = replay(deployment.transport, deployment.topology, state_dir, verify=True)
        assert json.dumps(report.as_dict())  # as the CLI prints it
        return report.differences

    lost = verify_after(lambda batch: batch.delete_index(row))
    assert any(" index: rebuilt " in d for d in lost), lost
    assert verify_after(lambda batch: batch.put_index(row)) == []  # that row was all
    added = verify_after(lambda batch: batch.put_index(wrong))
    assert any(" index: rebuilt " in d for d in added), added


def test_the_loop_keeps_the_metrics_census_as_a_recount_finds_it(harness: LoopHarness) -> None:
    h = harness
    runs = _runs(h)
    kept = _census_totals([c.snapshot() for c in h.loop.census.values()])
    waiting_on = {"square": 1, "echo": 1}  # the two running runs, one at each target
    assert kept == (waiting_on, 0)
    with _readers(h.deployment.settings.state_dir) as stores:
        recounted = _census_totals([RunCensus.count_from(s).snapshot() for s in stores])
    assert recounted == kept
    # A run leaving its wait, or entering and leaving Unknown, moves the counts.
    waiting = next(r for r, (p, s, _) in runs.items() if p == "scalar" and s == "running")
    state = h.loop_state(waiting)
    assert state is not None
    census = RunCensus()
    census.change(None, state)
    assert census.snapshot() == ({"echo": 1}, 0)
    unknown = state.model_copy(update={"phase": "unknown"})
    census.change(state, unknown)
    assert census.snapshot() == ({}, 1)
    census.change(unknown, unknown.model_copy(update={"status": "failed"}))
    assert census.snapshot() == ({}, 0)


def _census_totals(snapshots: list[tuple[dict[str, int], int]]) -> tuple[dict[str, int], int]:
    waiting: dict[str, int] = {}
    for by_target, _ in snapshots:
        for target, count in by_target.items():
            waiting[target] = waiting.get(target, 0) + count
    return waiting, sum(unknown for _, unknown in snapshots)
