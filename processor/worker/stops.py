"""Stop notices for a worker's running attempts, read from segments.control.

The processor sends a ``StopNotice`` when a stop commits while the run's attempt
runs. Every worker process reads every notice (a reader of all the topic's
partitions, from their ends when its first worker starts, outside any consumer
group), so a notice reaches its attempt wherever the attempt runs and however much
work is queued in front of it. A notice for an attempt that has not started here
yet is remembered for a while, so the attempt starts with its stop flag set if it
comes later. The workers of one process share one listener (``LISTENERS``): the
attempts they run are in one registry (``RUNNING``).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict

from processor.errors import FactDecodeError, TransportError
from processor.facts.codec import codec
from processor.facts.models import StopNotice
from processor.facts.topics import TopicName
from processor.transport.base import Reader, TopicPartition, Transport
from processor.transport.topology import Topology
from processor.worker.attempts import RUNNING, ref_of
from processor.worker.context import AttemptRef

__all__ = ["LISTENERS", "REMEMBERED", "SharedListeners", "StopListener"]

logger = logging.getLogger(__name__)

#: How often the listener looks for new notices.
POLL_S = 0.1
#: Notices kept for attempts that have not started here (the oldest go first).
REMEMBERED = 10_000


class StopListener:
    """Applies the stop notices of segments.control to the attempts of this process."""

    def __init__(self, transport: Transport, topology: Topology, name: str) -> None:
        self._transport = transport
        topic = topology.name(TopicName.CONTROL)
        self._partitions = [TopicPartition(topic, p) for p in range(topology.partitions)]
        self._name = name
        self._lock = threading.Lock()
        self._recent: OrderedDict[AttemptRef, StopNotice] = OrderedDict()
        self._missing_logged = False

    def notice_for(self, ref: AttemptRef) -> StopNotice | None:
        """A notice already read for the attempt ``ref`` (one about to start)."""
        with self._lock:
            return self._recent.get(ref)

    def apply(self, notice: StopNotice) -> None:
        """Set the stop flag of the notice's attempt if it runs here; remember it."""
        ref = ref_of(notice)
        with self._lock:
            self._recent[ref] = notice
            self._recent.move_to_end(ref)
            while len(self._recent) > REMEMBERED:
                self._recent.popitem(last=False)
        if RUNNING.stop(notice):
            logger.info("stop requested for attempt %s of run %s", notice.attempt, notice.run_id)

    def run(self, stop: threading.Event) -> None:
        """Read notices from the ends the topic has now, until ``stop`` is set."""
        reader = self._transport.reader()
        positions: dict[TopicPartition, int] = {}
        try:
            self._read_new(reader, positions)
            while not stop.wait(POLL_S):
                self._read_new(reader, positions)
        finally:
            reader.close()

    def _read_new(self, reader: Reader, positions: dict[TopicPartition, int]) -> None:
        """Apply the notices after ``positions``. A partition seen for the first time
        (at start, or once the topic exists) starts at its end then. A failure is
        logged once until a round reads every partition again."""
        failed = False
        for tp in self._partitions:
            try:
                end = reader.end_offset(tp)
                start = positions.setdefault(tp, end)
                if end > start:
                    for batch in reader.read(tp, start, end):
                        for record in batch:
                            self._take(record.value)
                    positions[tp] = end
            except TransportError as exc:
                failed = True
                if not self._missing_logged:
                    logger.warning("%s: cannot read stop notices: %s", self._name, exc)
                    self._missing_logged = True
        if not failed and self._missing_logged:
            logger.warning("%s: reading stop notices again", self._name)
            self._missing_logged = False

    def _take(self, value: bytes | None) -> None:
        try:
            message = codec().decode(value or b"")
        except FactDecodeError as exc:
            logger.warning("%s: not a stop notice on segments.control: %s", self._name, exc)
            return
        if isinstance(message, StopNotice):
            self.apply(message)
        else:
            logger.warning(
                "%s: not a stop notice on segments.control: %s", self._name, type(message).__name__
            )


class SharedListeners:
    """One running ``StopListener`` per transport and topology in this process: the
    first worker to join starts it, the last to leave stops it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[tuple[int, str], _Running] = {}

    def join(self, transport: Transport, topology: Topology, name: str) -> StopListener:
        key = (id(transport), topology.name(TopicName.CONTROL))
        with self._lock:
            running = self._running.get(key)
            if running is None:
                running = _Running(StopListener(transport, topology, name), transport)
                self._running[key] = running
            running.members += 1
            return running.listener

    def leave(self, listener: StopListener) -> None:
        with self._lock:
            for key, running in list(self._running.items()):
                if running.listener is listener:
                    running.members -= 1
                    if running.members == 0:
                        del self._running[key]
                        running.stop()
                    return


class _Running:
    """A listener on its thread, and how many workers use it."""

    def __init__(self, listener: StopListener, transport: Transport) -> None:
        self.listener = listener
        self.transport = transport  # kept alive while its id is a key
        self.members = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=listener.run, args=(self._stop,), name="stop-listener", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


LISTENERS = SharedListeners()
