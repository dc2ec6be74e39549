"""The live workers and the pipeline versions they load, from their announcements.

Workers announce themselves on every partition of segments.results (``WorkerAnnouncement``,
``worker/announce.py``): at start, every ``worker_announce_interval_ms`` and when
they leave. The catalog is not durable: a processor rebuilds it by listening. Until
one interval after the processor started (a warm-up, so every live worker had a
chance to announce), and while it has never heard an announcement at all (workers of
an older release), it knows nothing: every version counts as loaded. A worker not
heard for ``EXPIRY_INTERVALS`` intervals is gone. Liveness is measured in elapsed
time (a monotonic clock by default), never with the processor's injected clock, which
tests and the test kit move by hours at once, nor with the worker's ``at_ms``
(clocks differ). Time the processor spent not looking (a long restore, a stall of
more than an interval between two rounds) does not count: the announcements sent
meanwhile wait in the topic, and expiring their workers would block runs for nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from processor.facts.models import WorkerAnnouncement
from processor.model.decision import LiveVersions

__all__ = ["EXPIRY_INTERVALS", "Fleet"]

logger = logging.getLogger(__name__)

EXPIRY_INTERVALS = 3


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class Fleet:
    """The processor's catalog of live workers (one per processor loop)."""

    def __init__(self, announce_interval_ms: int, clock: Callable[[], int] = monotonic_ms) -> None:
        self._interval = announce_interval_ms
        self._clock = clock
        self._warm_until = clock() + announce_interval_ms
        self._workers: dict[str, tuple[int, frozenset[tuple[str, int]]]] = {}
        self._heard_any = False
        self._live: LiveVersions = frozenset()
        self._known = False  # past the warm-up, with an announcement heard
        self._looked: int | None = None  # when ``live_versions`` was last called
        # The fleet changed since ``take_change``: blocked runs may now find a worker.
        self._changed = False

    def heard(self, announcement: WorkerAnnouncement) -> None:
        """Take a worker's announcement, heard now."""
        now = self._clock()
        self._heard_any = True
        worker = announcement.worker_id
        if announcement.leaving:
            if self._workers.pop(worker, None) is not None:
                logger.info("worker %s left", worker)
                self._changed_now()
            return
        loads = frozenset((p.name, p.version) for p in announcement.pipelines)
        previous = self._workers.get(worker)
        self._workers[worker] = (now, loads)
        if previous is None or previous[1] != loads:
            logger.info("worker %s loads %s", worker, _named(loads))
            self._changed_now()

    def live_versions(self) -> LiveVersions | None:
        """What live workers load; None while not known (every version counts as loaded)."""
        now = self._clock()
        self._skip_stall(now)
        self._expire(now)
        if not self._heard_any or now < self._warm_until:
            return None
        if not self._known:
            self._known = True
            self._changed = True  # the warm-up ended: a first look at the blocked runs
        return self._live

    def take_change(self) -> bool:
        """Whether the fleet changed (a worker came, left, expired or loads other
        versions) since the last call; the loop then wakes the blocked runs."""
        changed, self._changed = self._changed, False
        return changed

    def changed(self) -> None:
        """Look at the blocked runs again (partitions were assigned to this processor)."""
        self._changed = True

    @property
    def workers(self) -> dict[str, frozenset[tuple[str, int]]]:
        """The live workers and what each loads (as last computed)."""
        return {worker: loads for worker, (_, loads) in self._workers.items()}

    def _skip_stall(self, now: int) -> None:
        """Move every worker's last-heard time on by a gap between two looks longer
        than an interval: the processor was not listening then."""
        looked, self._looked = self._looked, now
        if looked is None or now - looked <= self._interval:
            return
        gap = now - looked
        self._workers = {w: (heard + gap, loads) for w, (heard, loads) in self._workers.items()}

    def _expire(self, now: int) -> None:
        horizon = now - EXPIRY_INTERVALS * self._interval
        gone = [worker for worker, (heard, _) in self._workers.items() if heard < horizon]
        for worker in gone:
            logger.info(
                "worker %s not heard for %d ms: gone", worker, now - self._workers[worker][0]
            )
            del self._workers[worker]
        if gone:
            self._changed_now()

    def _changed_now(self) -> None:
        self._changed = True
        self._live = frozenset().union(*(loads for _, loads in self._workers.values()))


def _named(loads: frozenset[tuple[str, int]]) -> str:
    return ", ".join(f"{name} v{version}" for name, version in sorted(loads)) or "nothing"
