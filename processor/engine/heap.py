"""Python's cyclic garbage collector, set for a long-running processor (``processor run``).

A processor allocates tens of thousands of short-lived objects a batch (facts,
projections, records) and keeps a large, stable heap from its start (modules, the
application, schemas, pydantic's validators). With Python's defaults the collector
starts a young collection every 700 net allocations and, now and then, a full one
that walks that whole stable heap: 25-70 ms with every other thread of the process
stopped (the GIL), measured in ``bench/children.py``'s rounds.

``settle`` runs once the processor has started: what is allocated by then is moved
out of the collector's reach (``gc.freeze``), so a full collection walks only what
came after, and young collections start ten times less often. Nothing is left
uncollected that would be collected otherwise, except cycles among the objects of
the start, which live as long as the process anyway.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "settle"]

#: Net allocations that start a young collection (Python's default: 700).
YOUNG_THRESHOLD = 7_000


def settle() -> None:
    """Collect once, freeze what is left, and collect the young generation less often."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
