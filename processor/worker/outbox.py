"""What a worker produces, from one thread that owns its producer.

Attempts finish on pool threads and the event loop, progress reports come from
step code: they all hand records to the outbox, which produces and flushes them
in batches and then calls each record's ``done`` (the worker finishes the work
item of a result only once the result is flushed).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from processor.errors import TransportError
from processor.transport.base import Outbound, Producer

__all__ = ["Outbox"]

logger = logging.getLogger(__name__)

_Entry = tuple[Outbound, Callable[[], None] | None]
_RETRY_S = 0.5


class Outbox:
    """Produce records handed over by any thread, from a thread of its own."""

    def __init__(self, make_producer: Callable[[], Producer], name: str) -> None:
        self._make_producer = make_producer
        self._queue: queue.SimpleQueue[_Entry | None] = queue.SimpleQueue()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"{name}-outbox", daemon=True)
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def start(self) -> None:
        """Start the thread and create the producer on it; raise what creating it raised."""
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def send(self, record: Outbound, done: Callable[[], None] | None = None) -> None:
        """Produce ``record``; call ``done`` (on the outbox thread) once it is flushed."""
        self._queue.put((record, done))

    def close(self, timeout_s: float = 30.0) -> None:
        """Produce what was handed over, then stop."""
        self._closing.set()
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _serve(self) -> None:
        try:
            producer = self._make_producer()
        except BaseException as exc:  # handed to start()
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            stopping = False
            while not stopping:
                batch, stopping = self._next_batch()
                if batch:
                    self._deliver(producer, batch)
        finally:
            producer.close()

    def _next_batch(self) -> tuple[list[_Entry], bool]:
        """The entries waiting (blocking for the first); whether close was called."""
        first = self._queue.get()
        if first is None:
            return [], True
        batch = [first]
        while True:
            try:
                entry = self._queue.get_nowait()
            except queue.Empty:
                return batch, False
            if entry is None:
                return batch, True
            batch.append(entry)

    def _deliver(self, producer: Producer, batch: list[_Entry]) -> None:
        """Produce and flush ``batch`` (again after a transport error, unless closing)."""
        while True:
            try:
                for record, _ in batch:
                    producer.produce(record)
                producer.flush()
                break
            except TransportError as exc:
                if self._closing.is_set():
                    logger.warning("outbox: dropping %d records at close: %s", len(batch), exc)
                    return
                logger.warning("outbox: transport error, producing again: %s", exc)
                self._closing.wait(_RETRY_S)
        for _, done in batch:
            if done is not None:
                done()
