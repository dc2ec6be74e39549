"""Where a worker's attempts run: a bounded pool of threads, and one event loop.

An attempt whose functions are all sync runs on a pool thread; one with an
``async def`` function runs on the event loop, its sync steps on the pool. The
pool has one thread per slot, so an attempt never waits for a thread. Threads are
daemons: a step that never returns does not keep the process alive after a stop.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import queue
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["StepRuntime"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_Job = tuple[Callable[[], Any], "Future[Any]"]


class _DaemonPool:
    """At most ``size`` daemon threads, started when first needed."""

    def __init__(self, size: int, name: str) -> None:
        self._size = size
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()

    def submit(self, function: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        context = contextvars.copy_context()
        self._jobs.put((lambda: context.run(function), future))
        with self._lock:
            if self._idle > 0:
                self._idle -= 1  # an idle thread will take the job
            elif len(self._threads) < self._size:
                thread = threading.Thread(
                    target=self._serve, name=f"{self._name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
            # else the job waits for a thread: not with the worker, which submits no more
            # jobs at once than the pool has threads
        return future

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            function, future = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(function())
                except BaseException as exc:  # handed to whoever waits on the future
                    future.set_exception(exc)
            with self._lock:
                self._idle += 1

    def close(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)


class StepRuntime:
    """A bounded thread pool and an event loop (on a thread of its own, when first used)."""

    def __init__(self, size: int, name: str = "steps") -> None:
        self._pool = _DaemonPool(size, name)
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def run_sync(self, function: Callable[[], T]) -> Future[T]:
        """Run ``function`` on a pool thread (with the caller's context variables)."""
        return self._pool.submit(function)

    def run_async(self, coroutine: Coroutine[Any, Any, T]) -> Future[T]:
        """Run ``coroutine`` on the event loop."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._running_loop())

    async def in_pool(self, function: Callable[[], T]) -> T:
        """From the event loop: await ``function`` run on a pool thread."""
        return await asyncio.wrap_future(self._pool.submit(function))

    def close(self) -> None:
        """Stop the loop (cancelling what still runs on it) and the idle pool threads."""
        self._pool.close()
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(_cancel_all_and_stop, loop)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=_serve_loop, args=(loop,), name=f"{self._name}-loop", daemon=True
                )
                thread.start()
                self._loop = loop
            return self._loop


def _serve_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.close()


def _cancel_all_and_stop(loop: asyncio.AbstractEventLoop) -> None:
    for task in asyncio.all_tasks(loop):
        task.cancel()
    loop.call_soon(loop.stop)
