"""What segments.control tells a worker's attempts: stop notices and claims' answers.

The processor sends a ``StopNotice`` when a stop commits while the run's attempt
runs (or is lost), and a ``ClaimReply`` to each claim of an attempt
(``model.claims``). Every worker process reads every record (a reader of all the
topic's partitions, from their ends when its first worker starts, outside any
consumer group), so a notice or an answer reaches its attempt wherever the attempt
runs and however much work is queued in front of it. A notice for an attempt that
has not started here yet is remembered for a while: the worker does not run that
attempt if its work item comes later. The workers of one process share one listener
(``LISTENERS``): the attempts they run are in one registry (``RUNNING``).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict

from processor.errors import FactDecodeError, TransportError
from processor.facts.codec import codec
from processor.facts.models import ClaimReply, StopNotice
from processor.facts.topics import TopicName
from processor.transport.base import Reader, TopicPartition, Transport
from processor.transport.topology import Topology
from processor.worker.attempts import RUNNING, ref_of
from processor.worker.context import AttemptRef

__all__ = ["LISTENERS", "REMEMBERED", "ControlListener", "SharedListeners"]

logger = logging.getLogger(__name__)

#: How often the listener looks for new records.
POLL_S = 0.1
#: Notices kept for attempts that have not started here (the oldest go first).
REMEMBERED = 10_000


class ControlListener:
    """Applies what segments.control says to the attempts of this process."""

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

    def open(self) -> tuple[Reader, dict[TopicPartition, int]]:
        """A reader and the positions to read from: the ends the topic has now, taken
        before any attempt of this process can be answered (the rest when first seen)."""
        reader = self._transport.reader()
        positions: dict[TopicPartition, int] = {}
        self._read_new(reader, positions)
        return reader, positions

    def run(
        self, reader: Reader, positions: dict[TopicPartition, int], stop: threading.Event
    ) -> None:
        """Read what comes after ``positions`` until ``stop`` is set."""
        try:
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
                    logger.warning("%s: cannot read segments.control: %s", self._name, exc)
                    self._missing_logged = True
        if not failed and self._missing_logged:
            logger.warning("%s: reading segments.control again", self._name)
            self._missing_logged = False

    def _take(self, value: bytes | None) -> None:
        try:
            message = codec().decode(value or b"")
        except FactDecodeError as exc:
            logger.warning("%s: unreadable record on segments.control: %s", self._name, exc)
            return
        if isinstance(message, StopNotice):
            self.apply(message)
        elif isinstance(message, ClaimReply):
            RUNNING.answer(message)
        else:
            kind = type(message).__name__
            logger.warning("%s: a %s on segments.control, skipped", self._name, kind)


class SharedListeners:
    """One running ``ControlListener`` per transport and topology in this process: the
    first worker to join starts it, the last to leave stops it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[tuple[int, str], _Running] = {}

    def join(self, transport: Transport, topology: Topology, name: str) -> ControlListener:
        key = (id(transport), topology.name(TopicName.CONTROL))
        with self._lock:
            running = self._running.get(key)
            if running is None:
                running = _Running(ControlListener(transport, topology, name), transport)
                self._running[key] = running
            running.members += 1
            return running.listener

    def leave(self, listener: ControlListener) -> None:
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

    def __init__(self, listener: ControlListener, transport: Transport) -> None:
        self.listener = listener
        self.transport = transport  # kept alive while its id is a key
        self.members = 0
        self._stop = threading.Event()
        reader, positions = listener.open()
        self._thread = threading.Thread(
            target=listener.run,
            args=(reader, positions, self._stop),
            name="control-listener",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


LISTENERS = SharedListeners()
