"""Fan-out bookkeeping: the limit in flight, the tolerance, settling, the output's order."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from processor.model.fan_out import FanOutProgress, ItemStatus, assemble
from processor.model.graph import FanOutLimits, Tolerance


def progress(
    limit: int, total: int, items: dict[int, ItemStatus], tolerance: Tolerance | None = None
) -> FanOutProgress:
    return FanOutProgress.of(FanOutLimits(limit, tolerance or Tolerance()), total, items)


def test_the_lowest_indexes_start_first_up_to_the_limit() -> None:
    assert progress(5, 200, {}).to_start() == (0, 1, 2, 3, 4)
    items: dict[int, ItemStatus] = {0: "succeeded", 1: "running", 2: "succeeded", 3: "running"}
    assert progress(3, 200, items).to_start() == (4,)
    assert progress(2, 200, items).to_start() == ()
    assert progress(5, 3, {}).to_start() == (0, 1, 2)


def test_a_tolerance_of_ten_percent_passes_at_20_of_200_and_fails_at_21() -> None:
    tolerance = Tolerance(percent=10)
    twenty: dict[int, ItemStatus] = dict.fromkeys(range(20), "failed")
    passing = progress(5, 200, twenty | dict.fromkeys(range(20, 200), "succeeded"), tolerance)
    assert not passing.failed
    assert passing.settled
    failing = progress(5, 200, twenty | {20: "failed", 21: "running"}, tolerance)
    assert failing.failed
    assert failing.to_start() == ()  # no new item once failed
    assert not failing.settled  # the open item is not interrupted
    assert progress(5, 200, twenty | {20: "failed", 21: "succeeded"}, tolerance).settled


def test_fail_fast_stops_at_the_first_failure() -> None:
    items: dict[int, ItemStatus] = {0: "succeeded", 1: "failed"}
    fast = progress(4, 10, items)
    assert fast.failed
    assert fast.settled
    assert fast.to_start() == ()
    assert not progress(4, 10, items, Tolerance(count=1)).failed


def test_it_settles_when_every_item_has() -> None:
    assert not progress(2, 3, {0: "succeeded", 1: "succeeded"}).settled
    assert not progress(2, 3, {0: "succeeded", 1: "succeeded", 2: "running"}).settled
    assert progress(2, 3, dict.fromkeys(range(3), "succeeded")).settled
    assert progress(2, 0, {}).settled


def test_the_output_is_in_item_index_order_with_the_errors() -> None:
    output = assemble(4, {3: "d", 0: "a", 2: "c"}, {1: "boom"})
    assert output.outputs == ("a", None, "c", "d")
    assert output.errors == ((1, "boom"),)
    assert output.not_started == ()
    stopped = assemble(3, {0: "a"}, {1: "boom"})
    assert stopped.not_started == (2,)


@given(
    limit=st.integers(1, 6),
    total=st.integers(0, 30),
    tolerated=st.integers(0, 5),
    outcomes=st.lists(st.booleans(), min_size=30, max_size=30),
    finish_order=st.randoms(use_true_random=False),
)
def test_never_more_than_the_limit_open_and_every_item_once(
    limit: int, total: int, tolerated: int, outcomes: list[bool], finish_order: random.Random
) -> None:
    """Drive a fan-out to its end, settling open items in a random order."""
    items: dict[int, ItemStatus] = {}
    started: list[int] = []
    state = progress(limit, total, items, Tolerance(count=tolerated))
    while not state.settled:
        new = state.to_start()
        started += new
        items |= dict.fromkeys(new, "running")
        state = progress(limit, total, items, Tolerance(count=tolerated))
        assert state.open <= limit
        running = [i for i, s in items.items() if s == "running"]
        done = finish_order.choice(running)
        items[done] = "succeeded" if outcomes[done] else "failed"
        state = progress(limit, total, items, Tolerance(count=tolerated))
    failures = sum(1 for s in items.values() if s == "failed")
    assert started == sorted(set(started))  # each once, lowest first
    assert state.failed == (failures > tolerated)
    if not state.failed:
        assert sorted(items) == list(range(total))
