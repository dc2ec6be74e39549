"""The workers of one process start their work together, once all have joined.

A consumer group balances partitions among its members: a worker that joins after
another has taken work items makes Kafka move partitions away from it, and the
items it runs from them are delivered to the newcomer, which runs them again. So
the workers one process starts (``processor run``'s in-process workers, ``processor
worker --workers N``) share a ``JoinGate``: each holds its consumer (in the group,
taking nothing) until every one of them has joined, then all take work.
"""

from __future__ import annotations

import threading

__all__ = ["JoinGate"]


class JoinGate:
    """Opens once ``members`` workers have joined their group (thread-safe)."""

    def __init__(self, members: int) -> None:
        self._lock = threading.Lock()
        self._waiting = members
        self.opened = threading.Event()
        if members <= 0:
            self.opened.set()

    def joined(self) -> None:
        """One more member has joined (each calls this once)."""
        with self._lock:
            self._waiting -= 1
            if self._waiting <= 0:
                self.opened.set()
