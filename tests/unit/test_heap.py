"""``processor run`` settles the heap once started (processor/engine/heap.py)."""

from __future__ import annotations

import gc

from processor.engine.heap import YOUNG_THRESHOLD, settle


def test_settle_freezes_the_heap_and_collects_the_young_generation_less_often() -> None:
    threshold = gc.get_threshold()
    gc.unfreeze()
    try:
        settle()
        assert gc.get_freeze_count() > 0  # what was allocated so far: out of reach
        assert gc.get_threshold() == (YOUNG_THRESHOLD, *threshold[1:])
        assert gc.isenabled()
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
