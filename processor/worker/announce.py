"""A worker's announcements: who it is and which pipeline versions it can run.

A ``WorkerAnnouncement`` goes to every partition of segments.results (each processor
reads only the partitions it owns, and must hear every worker): when the worker
starts, every ``worker_announce_interval_ms`` (``PROCESSOR_WORKER_ANNOUNCE_INTERVAL_MS``)
while it runs, and with ``leaving=True`` when it stops. The processors keep the live
ones (``engine/fleet.py``) and hold back runs whose version none of them loads.

Announcing runs on a thread of its own, with a producer of its own: a worker busy
with a long step is still alive, and must not expire at the processors.
"""

from __future__ import annotations

import logging
import threading

from processor.config.settings import default_of
from processor.errors import TransportError
from processor.facts.codec import encode
from processor.facts.models import LoadedPipeline, WorkerAnnouncement
from processor.facts.topics import TopicName
from processor.transport.base import Outbound, Producer
from processor.transport.clock import Clock, wall_clock_ms
from processor.transport.topology import Topology
from processor.worker.pipeline import Application

__all__ = ["Announcer"]

logger = logging.getLogger(__name__)


class Announcer:
    """Sends one worker's announcements (``run``, on a thread of its own)."""

    def __init__(
        self,
        app: Application,
        topology: Topology,
        *,
        worker_id: str,
        group: str,
        concurrency: int = 1,
        interval_ms: int = default_of("worker_announce_interval_ms"),
        clock: Clock = wall_clock_ms,
    ) -> None:
        self._topology = topology
        self._worker_id = worker_id
        self._group = group
        self._concurrency = concurrency
        self._interval_ms = interval_ms
        self._clock = clock
        self._pipelines = tuple(LoadedPipeline(name=n, version=v) for n, v in app.versions)
        self.announced = threading.Event()  # the first announcement is flushed

    def announcement(self, *, leaving: bool = False) -> WorkerAnnouncement:
        return WorkerAnnouncement(
            worker_id=self._worker_id,
            group=self._group,
            pipelines=self._pipelines,
            concurrency=self._concurrency,
            at_ms=self._clock(),
            leaving=leaving,
        )

    def records(self, *, leaving: bool = False) -> list[Outbound]:
        """The announcement, once for each partition of segments.results."""
        topic = self._topology.name(TopicName.RESULTS)
        value = encode(self.announcement(leaving=leaving))
        key = self._worker_id.encode()
        return [Outbound(topic, key, value, (), p) for p in range(self._topology.partitions)]

    def run(self, producer: Producer, stop: threading.Event) -> None:
        """Announce now and every interval until ``stop`` is set, then say the worker
        leaves (best effort: otherwise it expires); close ``producer``."""
        try:
            while True:
                self._send(producer, leaving=False)
                if stop.wait(self._interval_ms / 1000):
                    break
            self._send(producer, leaving=True)
        finally:
            producer.close()

    def _send(self, producer: Producer, *, leaving: bool) -> None:
        try:
            for record in self.records(leaving=leaving):
                producer.produce(record)
            producer.flush()
            self.announced.set()
        except TransportError as exc:  # the next announcement, or expiry, repairs it
            logger.warning("%s: announcement not sent: %s", self._worker_id, exc)
