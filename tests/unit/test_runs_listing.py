"""The runs index: its rows (model/listing.py), its keys, and listing pages from it."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.model.listing import IndexEntry, index_entries, waiting_targets
from processor.model.state import Boundary, Interaction, RunState
from processor.store import keys
from processor.store.listing import RunQuery, list_runs, waiting_runs
from processor.store.rocks import PartitionStore, store_path


def _run(
    run_id: str,
    submitted_ms: int,
    *,
    pipeline: str = "orders",
    status: str = "running",
    waiting: tuple[str, ...] = (),
) -> RunState:
    interactions = {
        f"i{n}": Interaction(
            boundary=1, item_index=n, kind="await", target=t, deadline_ms=0, token_digest=b"d"
        )
        for n, t in enumerate(waiting)
    }
    return RunState.model_validate(
        {
            "run_id": run_id,
            "pipeline": pipeline,
            "pipeline_version": 1,
            "status": status,
            "input": b"",
            "submitted_ms": submitted_ms,
            "created_ms": submitted_ms,
            "updated_ms": submitted_ms + 5,
            "submit_command_id": "c",
            "last_output": b"",
            "phase": "suspended" if waiting else "idle",
            "boundary": Boundary(number=1),
            "interactions": interactions,
        }
    )


def test_a_run_has_one_row_per_listing_it_is_in() -> None:
    state = _run("r1", 7, waiting=("billing", "billing", "crm"))
    assert index_entries(None) == frozenset()
    assert index_entries(state) == {
        IndexEntry("all", (), 7, "r1"),
        IndexEntry("status", ("running",), 7, "r1"),
        IndexEntry("pipeline", ("orders",), 7, "r1"),
        IndexEntry("pipeline_status", ("orders", "running"), 7, "r1"),
        IndexEntry("waiting", ("billing",), 7, "r1"),
        IndexEntry("waiting_pipeline", ("billing", "orders"), 7, "r1"),
        IndexEntry("waiting", ("crm",), 7, "r1"),
        IndexEntry("waiting_pipeline", ("crm", "orders"), 7, "r1"),
    }
    assert waiting_targets(state) == ("billing", "crm")


def test_an_admitted_interaction_or_a_terminal_run_waits_on_nothing() -> None:
    state = _run("r1", 7, waiting=("billing",))
    admitted = state.model_copy(
        update={
            "interactions": {
                "i0": state.interactions["i0"].model_copy(update={"status": "admitted"})
            }
        }
    )
    assert waiting_targets(admitted) == ()
    failed = state.model_copy(update={"status": "failed"})
    assert waiting_targets(failed) == ()
    assert {e.kind for e in index_entries(failed)} == {
        "all",
        "status",
        "pipeline",
        "pipeline_status",
    }
    elsewhere = state.model_copy(update={"boundary": Boundary(number=2)})
    assert waiting_targets(elsewhere) == ()  # an open interaction of an earlier boundary


@given(
    st.lists(
        st.tuples(st.integers(0, 2**48), st.text(min_size=1, max_size=12)),
        min_size=2,
        max_size=20,
        unique_by=lambda t: t[1],
    )
)
def test_index_keys_sort_newest_submitted_first_then_by_run_id(
    runs: list[tuple[int, str]],
) -> None:
    entries = [IndexEntry("status", ("running",), at, run_id) for at, run_id in runs]
    by_key = sorted(entries, key=keys.index_key)
    assert [(e.submitted_ms, e.run_id) for e in by_key] == sorted(
        ((at, run_id) for at, run_id in runs), key=lambda t: (-t[0], t[1].encode())
    )
    prefix = keys.index_prefix("status", ("running",))
    for entry in entries:
        position = keys.index_key(entry)[len(prefix) :]
        assert keys.index_tail(position) == (entry.submitted_ms, entry.run_id)


def test_the_parts_are_length_prefixed() -> None:
    # ("ab", "c") and ("a", "bc") must not share rows.
    one = keys.index_prefix("pipeline_status", ("ab", "c"))
    other = keys.index_prefix("pipeline_status", ("a", "bc"))
    assert not one.startswith(other) and not other.startswith(one)


# --- listing pages -------------------------------------------------------------------------


def _write(store: PartitionStore, states: list[RunState]) -> None:
    batch = store.batch()
    for state in states:
        batch.put_run(state)
        for entry in index_entries(state):
            batch.put_index(entry)
    store.write(batch)


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[list[PartitionStore]]:
    opened = [PartitionStore(store_path(tmp_path, p)) for p in range(3)]
    yield opened
    for store in opened:
        store.close()


def _fill(stores: list[PartitionStore]) -> list[RunState]:
    """30 runs over 3 partitions: two pipelines, three statuses, some sharing a time."""
    states = []
    for n in range(30):
        status = ("running", "succeeded", "failed")[(n // 3) % 3]
        waiting = ("billing",) if status == "running" and n % 2 == 0 else ()
        pipeline = "orders" if n % 4 < 2 else "refunds"
        states.append(
            _run(f"run-{n:02d}", 1_000 + n // 2, pipeline=pipeline, status=status, waiting=waiting)
        )
    for n, store in enumerate(stores):
        _write(store, states[n::3])
    return states


def _newest_first(states: list[RunState]) -> list[str]:
    return [s.run_id for s in sorted(states, key=lambda s: (-s.submitted_ms, s.run_id))]


def _all_pages(stores: list[PartitionStore], query: RunQuery, limit: int) -> list[str]:
    shown: list[str] = []
    cursor = None
    for _ in range(100):
        page = list_runs(stores, query, cursor, limit)
        assert len(page.runs) <= limit
        shown += [run.run_id for run in page.runs]
        cursor = page.next_cursor
        if cursor is None:
            return shown
    raise AssertionError("the pages never ended")


@pytest.mark.parametrize(
    ("query", "selects"),
    [
        (RunQuery(), lambda s: True),
        (RunQuery(status="failed"), lambda s: s.status == "failed"),
        (RunQuery(pipeline="refunds"), lambda s: s.pipeline == "refunds"),
        (
            RunQuery(status="running", pipeline="orders"),
            lambda s: s.status == "running" and s.pipeline == "orders",
        ),
        (RunQuery(target="billing"), lambda s: bool(s.interactions)),
        (
            RunQuery(target="billing", pipeline="orders"),
            lambda s: bool(s.interactions) and s.pipeline == "orders",
        ),
        (RunQuery(target="billing", status="failed"), lambda s: False),
        (RunQuery(target="nobody"), lambda s: False),
        (RunQuery(since_ms=1_004, until_ms=1_010), lambda s: 1_004 <= s.submitted_ms < 1_010),
        (
            RunQuery(status="succeeded", since_ms=1_007),
            lambda s: s.status == "succeeded" and s.submitted_ms >= 1_007,
        ),
        (RunQuery(until_ms=1_003), lambda s: s.submitted_ms < 1_003),
        (RunQuery(since_ms=1_005, until_ms=1_005), lambda s: False),
    ],
)
@pytest.mark.parametrize("limit", [1, 2, 7, 1000])
def test_pages_show_each_selected_run_once_newest_first(
    stores: list[PartitionStore], query: RunQuery, selects: object, limit: int
) -> None:
    states = _fill(stores)
    assert callable(selects)
    expected = _newest_first([s for s in states if selects(s)])
    assert _all_pages(stores, query, limit) == expected


def test_a_summary_tells_the_run_and_its_partition(stores: list[PartitionStore]) -> None:
    _fill(stores)
    page = list_runs(stores, RunQuery(target="billing"), None, 1)
    (run,) = page.runs
    assert run.as_dict() == {
        "run_id": "run-28",
        "pipeline": "orders",
        "pipeline_version": 1,
        "status": "running",
        "phase": "suspended",
        "submitted_ms": 1_014,
        "updated_ms": 1_019,
        "waiting_on": ["billing"],
        "partition": 1,
    }
    assert page.next_cursor is not None


def test_a_cursor_stays_put_when_runs_are_inserted(stores: list[PartitionStore]) -> None:
    states = _fill(stores)
    first = list_runs(stores, RunQuery(), None, 10)
    # Runs submitted later (newer than every page) and one in the middle of the range.
    _write(stores[1], [_run("late-1", 5_000), _run("late-2", 5_000)])
    _write(stores[2], [_run("run-05a", 1_002)])
    rest = _all_pages_after(stores, RunQuery(), first.next_cursor, 10)
    shown = [r.run_id for r in first.runs] + rest
    expected = _newest_first(states)
    assert [r for r in shown if r != "run-05a"] == expected
    assert shown.count("run-05a") == 1  # after the cursor: it is listed, once


def _all_pages_after(
    stores: list[PartitionStore], query: RunQuery, cursor: str | None, limit: int
) -> list[str]:
    shown: list[str] = []
    while cursor is not None:
        page = list_runs(stores, query, cursor, limit)
        shown += [r.run_id for r in page.runs]
        cursor = page.next_cursor
    return shown


def test_the_last_page_has_no_cursor(stores: list[PartitionStore]) -> None:
    _fill(stores)
    page = list_runs(stores, RunQuery(status="failed"), None, 9)
    assert len(page.runs) == 9 and page.next_cursor is None
    assert list_runs(stores, RunQuery(status="failed"), None, 8).next_cursor is not None


@pytest.mark.parametrize("limit", [0, -1, 1001])
def test_a_limit_out_of_range_is_refused(stores: list[PartitionStore], limit: int) -> None:
    with pytest.raises(ValueError, match="limit must be between 1 and 1000"):
        list_runs(stores, RunQuery(), None, limit)


def _forged(value: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    ("cursor", "reason"),
    [
        ("%%%", "not a cursor"),
        ("bm90IGpzb24", "not a cursor"),  # "not json"
        (_forged({"q": "x"}), "not a cursor"),
        (_forged({"q": "x", "at": [-1, "r"]}), "not a cursor"),
        (_forged({"q": "x", "at": ["1", "r"]}), "not a cursor"),
        (_forged([1, 2]), "not a cursor"),
    ],
)
def test_a_bad_cursor_is_refused_with_a_reason(
    stores: list[PartitionStore], cursor: str, reason: str
) -> None:
    with pytest.raises(ValueError, match=f"invalid cursor.*{reason}"):
        list_runs(stores, RunQuery(), cursor, 10)


def test_a_cursor_of_another_query_is_refused(stores: list[PartitionStore]) -> None:
    _fill(stores)
    cursor = list_runs(stores, RunQuery(status="failed"), None, 2).next_cursor
    assert cursor is not None
    with pytest.raises(ValueError, match="other filters"):
        list_runs(stores, RunQuery(status="succeeded"), cursor, 2)


def test_bad_filters_are_refused(stores: list[PartitionStore]) -> None:
    with pytest.raises(ValueError, match="unknown status 'done'"):
        list_runs(stores, RunQuery(status="done"), None, 10)
    with pytest.raises(ValueError, match="since_ms must be"):
        list_runs(stores, RunQuery(since_ms=-5), None, 10)


def test_a_listing_reads_no_run_outside_its_page(
    stores: list[PartitionStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill(stores)
    asked: list[list[str]] = []
    original = PartitionStore.runs

    def runs(self: PartitionStore, run_ids: list[str]) -> list[RunState | None]:
        asked.append(list(run_ids))
        return original(self, run_ids)

    monkeypatch.setattr(PartitionStore, "runs", runs)
    monkeypatch.setattr(PartitionStore, "items", lambda *a: pytest.fail("a scan"))
    page = list_runs(stores, RunQuery(), None, 4)
    assert sorted(r for ids in asked for r in ids) == sorted(r.run_id for r in page.runs)
    assert len(asked) <= len(stores)  # one multi-get per partition


def test_waiting_runs_lists_each_waiting_run_once(stores: list[PartitionStore]) -> None:
    states = _fill(stores)
    _write(stores[0], [_run("two-targets", 9, waiting=("billing", "crm"))])
    waiting = {s.run_id for s in states if s.interactions} | {"two-targets"}
    found = list(waiting_runs(stores, None))
    assert sorted(run_id for _, run_id in found) == sorted(waiting)
    assert list(waiting_runs(stores, "crm")) == [(0, "two-targets")]
    by_partition = {run_id: p for p, run_id in waiting_runs(stores, "billing")}
    assert by_partition["run-10"] == 1  # the 11th run went to partition 10 % 3
