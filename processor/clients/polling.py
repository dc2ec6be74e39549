"""Waiting for something to show up in the log, with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["poll_until"]

T = TypeVar("T")

_FIRST_PAUSE_S = 0.005
_LONGEST_PAUSE_S = 0.1


def poll_until(attempt: Callable[[], T | None], deadline: float) -> T | None:
    """Call ``attempt`` until it returns something (returned) or the ``time.monotonic()``
    deadline passes (None); it is called at least once. Pauses grow from 5 to 100 ms."""
    pause = _FIRST_PAUSE_S
    while True:
        found = attempt()
        if found is not None:
            return found
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        time.sleep(min(pause, remaining))  # polling the log, bounded by the deadline
        pause = min(pause * 2, _LONGEST_PAUSE_S)
