"""Blocking client calls with a deadline that the client library cannot ignore.

librdkafka's transactional calls take a timeout, but some ignore it: with
librdkafka 2.16, ``send_offsets_to_transaction`` (and possibly
``commit_transaction``) can block forever when the group coordinator goes away
during the call (confluentinc/librdkafka#5456, #5511). A call into C cannot be
interrupted, so the only defence is not to wait for it: the call runs on a
helper thread and the caller waits at most a deadline. A call that misses it
keeps the helper thread, and the client it was calling is abandoned: the
watchdog refuses every later call, and the client's cleanup runs on the helper
thread after the stuck call returns (if it ever does).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from processor.errors import SessionLostError

__all__ = ["Watchdog"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class _Call(Generic[T]):
    """One call handed to the helper thread, and its outcome."""

    __slots__ = ("call", "done", "error", "result")

    def __init__(self, call: Callable[[], T]) -> None:
        self.call = call
        self.done = threading.Event()
        self.result: T | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.call()
        except BaseException as exc:  # handed back to the caller
            self.error = exc
        finally:
            self.done.set()

    def outcome(self) -> T:
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]  # None only when T admits it


class Watchdog:
    """Runs one client's blocking calls on a helper thread, waiting for each at most a deadline.

    Use it from one thread at a time. After a call missed its deadline
    (``stuck``), ``call`` raises ``SessionLostError`` at once.
    """

    def __init__(self, name: str, deadline_s: float) -> None:
        self._name = name
        self.deadline_s = deadline_s
        self._calls: queue.SimpleQueue[_Call[Any] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.stuck: str | None = None  # what the call that missed its deadline was doing

    def call(self, what: str, call: Callable[[], T]) -> T:
        """``call()``'s result or exception; ``SessionLostError`` when it misses the deadline."""
        self.check()
        pending = _Call(call)
        self._submit(pending)
        if not pending.done.wait(self.deadline_s):
            self.stuck = what
            logger.error(
                "%s: %s did not return within %.0fs (the client ignored its own timeout); "
                "abandoning the client, its call cannot be interrupted",
                self._name,
                what,
                self.deadline_s,
            )
            self.check()
        return pending.outcome()

    def check(self) -> None:
        """Raise ``SessionLostError`` if a call missed its deadline."""
        if self.stuck is not None:
            raise SessionLostError(
                f"{self._name}: {self.stuck} hung for more than {self.deadline_s:.0f}s; "
                "the client is abandoned: close this session and open a new one"
            )

    def close(self, cleanup: Callable[[], None]) -> None:
        """Run ``cleanup`` (close the client) and stop the helper thread.

        After a stuck call, ``cleanup`` is queued behind it and this returns at once.
        """
        if self.stuck is None:
            with contextlib.suppress(SessionLostError):  # logged; cleanup itself hung
                self.call("close", cleanup)
        else:
            logger.warning(
                "%s: the client is closed when its stuck call (%s) returns", self._name, self.stuck
            )
            self._submit(_Call(cleanup))
        if self._thread is not None:
            self._calls.put(None)

    def _submit(self, pending: _Call[Any]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._serve, name=f"{self._name} watchdog", daemon=True
            )
            self._thread.start()
        self._calls.put(pending)

    def _serve(self) -> None:
        while (pending := self._calls.get()) is not None:
            pending.run()
