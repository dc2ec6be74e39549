"""bench/_support.py's orders: ``--no-retries`` submits only orders the demo never fails."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from processor.examples import demo

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_no_retries_orders_are_those_the_demos_inventory_never_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    from _support import orders, refused_once

    every = list(itertools.islice(orders(), 200))
    refused = [placed for placed in every if refused_once(placed["order_id"])]
    assert 20 <= len(refused) <= 60  # about one in five, as the demo says
    for placed in refused:  # the demo's rule: each of these fails once, then passes
        with pytest.raises(demo.InventoryBusyError):
            demo.reserve_stock(placed)
        assert demo.reserve_stock(placed)["reserved"] is True
    steady = list(itertools.islice(orders(no_retries=True), 200))
    assert not any(placed in refused for placed in steady)
    for placed in steady:  # none fails the first time
        assert demo.reserve_stock(placed)["reserved"] is True
