"""Pausing Python's cyclic garbage collector around one batch of allocations."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["gc_paused"]


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while one batch is built (never around a blocking call).

    A batch of a hot loop (messages turned into records, facts decoded, folded and
    written) allocates tens of thousands of objects that hold no reference cycles;
    the collections they trigger, which also walk every long-lived object, are pure
    overhead. Collections are deferred to the first allocation after the batch,
    never skipped.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
