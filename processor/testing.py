"""A test kit: run an Application in-process on the embedded log, on a clock you move.

```python
from processor.testing import LocalEnvironment

def test_an_order_is_invoiced():
    with LocalEnvironment(app) as env:
        run_id = env.submit("orders", {"order_id": "o-1", "amount": 10})
        env.complete(run_id, {"order_id": "o-1", "amount": 12.0, "payment_id": "p-1"})
        assert env.wait(run_id).output["status"] == "invoiced"
```

The processor and the workers read only ``env.clock``, a ``ManualClock`` that
stands still until ``advance`` moves it forward: attempt timeouts, retry
backoffs, await timeouts, run deadlines and sleeps (every timer the processor keeps)
fire when the test says so, never because real time passed. ``advance``
returns once the processor has fired every timer due by the new time, so what
follows sees their effects. Waits are bounded by real-time deadlines on real
conditions (a round of the processor, a fact, a request): no fixed sleeps.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from processor.clients.client import Client, fact_dict, new_submit
from processor.clients.outcome import RunResult
from processor.clients.pending import PendingRequest, pending_requests
from processor.clients.polling import poll_until
from processor.config.resume_secret import resume_keys
from processor.config.settings import Settings
from processor.engine.host import Host
from processor.errors import ProcessorError, UnknownRunError, WaitTimeoutError
from processor.facts.keyring import KeyRing
from processor.facts.models import FactHeader
from processor.model.state import RunState
from processor.store.readers import open_readers
from processor.transport.deployment import Deployment
from processor.worker.pipeline import Application, load_application

__all__ = ["DEFAULT_START_MS", "LocalEnvironment", "ManualClock"]

F = TypeVar("F", bound=FactHeader)

#: 2030-01-01T00:00:00Z: a fixed start, so that the times in a history are the same each run.
DEFAULT_START_MS = 1_893_456_000_000


class ManualClock:
    """Milliseconds since the epoch that move only when ``advance`` is called, only forward.

    Forward only, because the facts record the times the processor read: a clock
    that went back would make a timer fire twice or a history's times decrease.
    """

    def __init__(self, start_ms: int = DEFAULT_START_MS) -> None:
        if start_ms < 0:
            raise ValueError(f"start_ms must be >= 0, got {start_ms}")
        self._now = start_ms
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            return self._now

    def advance(self, ms: int) -> int:
        """Move the clock ``ms`` milliseconds forward (0 is allowed); return the new time."""
        if ms < 0:
            raise ValueError(f"the clock only moves forward: advance({ms})")
        with self._lock:
            self._now += ms
            return self._now


class _Rounds:
    """The processor rounds that completed, by the monotonic time each started."""

    def __init__(self) -> None:
        self._done = threading.Condition()
        self._latest_start = float("-inf")
        self._latest_end = float("-inf")

    def record(self, started: float) -> None:
        with self._done:
            self._latest_start, self._latest_end = started, time.monotonic()
            self._done.notify_all()

    def await_round(self, after: float, deadline: float, host: Host) -> float:
        """Wait for a round that started after ``after`` to complete; return when it ended."""
        with self._done:
            while self._latest_start <= after:
                if host.errors:
                    raise ProcessorError(f"the processor stopped: {host.errors[0]!r}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("the processor did not complete a round in time")
                self._done.wait(min(remaining, 0.5))
            return self._latest_end


class LocalEnvironment:
    """An Application run in-process (a processor and ``workers`` worker threads) on a
    temporary embedded log, with a ``ManualClock``. Use it as a context manager.

    Args:
        app: the application under test, or where it is (``"mymodule:app"``, as
            ``processor run --app`` takes it).
        start_ms: where the clock starts (epoch milliseconds).
        workers: workers (threads); a step that blocks holds one of a worker's slots.
        concurrency: attempts each worker runs at once (default: the
            ``worker_concurrency`` setting, 8). Steps may take a ``StepContext``; its
            start reports, heartbeat throttling and deadline warnings follow ``clock``.
        data_dir: where the log and stores go (default: a temporary directory,
            removed on exit).
        partitions: partitions of each topic (1 keeps start-up fast).
    """

    def __init__(
        self,
        app: Application | str,
        *,
        start_ms: int = DEFAULT_START_MS,
        workers: int = 2,
        concurrency: int | None = None,
        data_dir: Path | None = None,
        partitions: int = 1,
    ) -> None:
        self.app = load_application(app) if isinstance(app, str) else app
        self.clock = ManualClock(start_ms)
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="processor-test-")
            data_dir = Path(self._tmp.name)
        # Explicit values win over PROCESSOR_* variables: the kit is embedded by definition.
        # Timers are scanned every round (1 ms), so that ``advance`` returns quickly. Every
        # step reports its start at once: its timeout counts from there on the manual clock.
        self.settings = Settings(
            broker=None,
            data_dir=data_dir,
            partitions=partitions,
            timer_interval_ms=1,
            start_report_after_ms=0,
        )
        self._workers = workers
        self._concurrency = concurrency
        self._rounds = _Rounds()
        self._host: Host | None = None
        self._client: Client | None = None

    # --- lifecycle -----------------------------------------------------------------------

    def __enter__(self) -> LocalEnvironment:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> None:
        """Start the processor and the workers (``with`` does it)."""
        deployment = Deployment.from_settings(self.settings)
        self._host = Host(
            deployment,
            self.app,
            workers=self._workers,
            concurrency=self._concurrency,
            clock=self.clock,
            on_round=self._rounds.record,
        )
        self._host.start()
        self._client = Client(
            deployment.transport,
            deployment.topology,
            self.settings.state_dir,
            group=self.settings.group,
        )
        self.settle()  # partitions assigned and restored before the first submit

    def close(self) -> None:
        """Stop the threads and remove the temporary data directory."""
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._host is not None:
            self._host.stop()
            self._host = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    @property
    def client(self) -> Client:
        """The client the kit uses (for what the kit does not wrap: cancel, redrive...)."""
        if self._client is None:
            raise RuntimeError("the environment is not started: use it in a with block")
        return self._client

    @property
    def host(self) -> Host:
        """The Host running the processor and the workers."""
        if self._host is None:
            raise RuntimeError("the environment is not started: use it in a with block")
        return self._host

    # --- time ----------------------------------------------------------------------------

    @property
    def now_ms(self) -> int:
        """The processor's time (epoch milliseconds)."""
        return self.clock()

    def advance(self, seconds: float, *, timeout_s: float = 10.0) -> int:
        """Move the clock ``seconds`` forward, then wait until the processor has fired (and
        committed) every timer due by the new time; return the new time in ms.

        Raises:
            ValueError: ``seconds`` is negative (the clock only moves forward).
            TimeoutError: the processor did not finish within ``timeout_s`` of real time.
        """
        if seconds < 0:
            raise ValueError(f"the clock only moves forward: advance({seconds})")
        now = self.clock.advance(round(seconds * 1000))
        self.settle(timeout_s=timeout_s)
        return now

    def settle(self, *, timeout_s: float = 10.0) -> None:
        """Wait until the processor has run a full timer scan at the current time.

        A round that started after the clock moved reads the new time; the timer scan
        runs at most every ``timer_interval_ms``, so a round begun that long after the
        first one ended has scanned (or a round between them did) and committed.
        """
        deadline = time.monotonic() + timeout_s
        interval_s = self.settings.timer_interval_ms / 1000
        first_end = self._rounds.await_round(time.monotonic(), deadline, self.host)
        self._rounds.await_round(first_end + interval_s, deadline, self.host)

    # --- runs ----------------------------------------------------------------------------

    def submit(
        self,
        pipeline: str,
        input_value: Any,
        *,
        idempotency_key: str | None = None,
        deadline_s: float | None = None,
        timeout_s: float = 10.0,
    ) -> str:
        """Submit a run at the clock's time and return its id once the processor accepted it.

        Raises:
            ProcessorError: the processor refused the submit (the reason in the message).
            TimeoutError: no answer within ``timeout_s``.
        """
        after_ms = None if deadline_s is None else round(deadline_s * 1000)
        command = new_submit(
            pipeline, input_value, idempotency_key, self.clock(), deadline_after_ms=after_ms
        )
        reply = self.client.request(command, timeout_s)
        if reply is None:
            raise TimeoutError(f"no answer to the submit of {pipeline!r} in {timeout_s}s")
        if reply.refusal:
            raise ProcessorError(f"submit refused: {reply.refusal}: {reply.detail or ''}")
        return reply.run_id

    def wait(self, run_id: str, timeout_s: float = 10.0) -> RunResult:
        """Wait until the run ends (real time, up to ``timeout_s``); return its outcome.

        It returns once the stores have applied the end too (the processor writes them
        just after the commit that makes the end visible), so what reads them
        (``pending``, ``stored_status``) agrees with the outcome.

        Raises:
            WaitTimeoutError: the run did not end within ``timeout_s``.
            TimeoutError: it ended, but the stores had not applied it within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        result = self.client.wait(run_id, timeout_s)
        self._wait_stored(run_id, lambda state: state.terminal, deadline)
        return result

    def status(self, run_id: str) -> RunState | None:
        """The run's current state (None: no such run)."""
        return self.client.status(run_id)

    def history(self, run_id: str) -> list[FactHeader]:
        """The run's facts in order (typed: ``RunSubmitted``, ``SegmentFailed``...)."""
        return self.client.history(run_id)

    def history_dicts(self, run_id: str) -> list[dict[str, Any]]:
        """The run's facts as dicts (``{"type": "RunSubmitted", ...}``), as the CLI shows them."""
        return [fact_dict(fact) for fact in self.history(run_id)]

    def wait_fact(
        self, run_id: str, fact_type: type[F], *, count: int = 1, timeout_s: float = 10.0
    ) -> F:
        """Wait until the run's history holds ``count`` facts of ``fact_type``; return the
        last of them (``wait_fact(run_id, RetryScheduled)``). It returns once the stores
        have applied that fact too, so what reads them (``pending``, ``stored_status``)
        sees it."""
        deadline = time.monotonic() + timeout_s
        pause = 0.002
        while len(found := [f for f in self.history(run_id) if isinstance(f, fact_type)]) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"run {run_id}: {len(found)} {fact_type.__name__} facts after {timeout_s}s, "
                    f"wanted {count}"
                )
            time.sleep(pause)  # the poll interval of a deadline-bounded wait
            pause = min(pause * 2, 0.05)
        fact = found[count - 1]
        self._wait_stored(run_id, lambda state: state.version >= fact.seq, deadline)
        return fact

    def _wait_stored(
        self, run_id: str, applied: Callable[[RunState], bool], deadline: float
    ) -> None:
        """Wait until the stores' projection of the run shows what ``applied`` looks for
        (the processor writes them just after the commit that made it visible)."""

        def stored() -> RunState | None:
            state = self.client.stored_status(run_id)
            return state if state is not None and applied(state) else None

        if poll_until(stored, deadline) is None:
            raise TimeoutError(f"run {run_id}: the stores had not caught up with the log in time")

    # --- awaits --------------------------------------------------------------------------

    def pending(
        self, run_id: str | None = None, *, target: str | None = None
    ) -> list[PendingRequest]:
        """The open requests (of ``run_id``, to ``target``), with their resume tokens, now."""
        stores = open_readers(self.settings.state_dir)
        try:
            return pending_requests(stores, KeyRing(resume_keys(self.settings)), run_id, target)
        finally:
            for store in stores:
                store.close()

    def wait_pending(
        self, run_id: str | None = None, *, target: str | None = None, timeout_s: float = 10.0
    ) -> list[PendingRequest]:
        """Wait until there is at least one open request (of ``run_id``, to ``target``).

        Raises:
            AssertionError: the run ended without opening one.
            TimeoutError: none opened within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        pause = 0.002
        while not (found := self.pending(run_id, target=target)):
            if run_id is not None:
                self._fail_if_ended(run_id)
            if time.monotonic() > deadline:
                raise TimeoutError(f"no open request of {run_id or 'any run'} in {timeout_s}s")
            time.sleep(pause)  # the poll interval of a deadline-bounded wait
            pause = min(pause * 2, 0.05)
        return found

    def complete(
        self, request: str | PendingRequest, output: Any, *, timeout_s: float = 10.0
    ) -> None:
        """Answer an await with ``output``: a PendingRequest, or a run id whose one open
        request it answers (waiting up to ``timeout_s`` for it to open)."""
        self.client.complete(self._token(request, timeout_s), output)

    def fail(self, request: str | PendingRequest, error: str, *, timeout_s: float = 10.0) -> None:
        """Answer an await with a failure (see ``complete`` for ``request``)."""
        self.client.fail(self._token(request, timeout_s), error)

    def _token(self, request: str | PendingRequest, timeout_s: float) -> str:
        if isinstance(request, str):
            found = self.wait_pending(request, timeout_s=timeout_s)
            if len(found) != 1:
                raise ValueError(
                    f"run {request} has {len(found)} open requests: pass one of env.pending()"
                )
            request = found[0]
        if request.token is None:
            raise ValueError(f"request {request} has no token the configured keys make")
        return request.token

    def _fail_if_ended(self, run_id: str) -> None:
        try:
            ended = self.client.wait(run_id, timeout_s=0)
        except (UnknownRunError, WaitTimeoutError):
            return
        raise AssertionError(f"run {run_id} ended ({ended.status}) without an open request")
