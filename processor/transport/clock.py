"""The wall clock, read in this one place.

The pure core never reads it: the loop passes ``now`` into every decision, and
tests pass a fake ``Clock`` instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["Clock", "wall_clock_ms"]

#: Milliseconds since the Unix epoch, as the facts record time.
Clock = Callable[[], int]


def wall_clock_ms() -> int:
    """The wall clock in milliseconds since the Unix epoch."""
    return time.time_ns() // 1_000_000
