"""``processor run``'s in-process workers in one child process, off the processor's GIL.

The processor loop is on the critical path of every run; worker threads in its own
process take the GIL from it at every step. With ``worker_isolation = "process"`` (the
default) the Host starts ``python -m processor.engine.worker_child`` instead, and
the two talk over two pipes (their own, not stdin or stdout, which step code may use):

- parent -> child: the pickled ``ChildSpec``, then ``stop`` when the Host stops. End of
  file without ``stop`` means the parent died: the child ends at once, as its threads
  would have (its attempts are redelivered when the processor is back).
- child -> parent: JSON lines, ``{"ready": true}`` once its workers have joined their
  group (their ``JoinGate`` opened), then
  ``{"metrics": [...]}`` (``telemetry.metrics.Relay``): the parent records them, so its
  ``/metrics`` shows the workers' step durations, deadline warnings and rejections.

The child's workers have the ids threads would have (``<instance id>-wN``, static
members), so a restarted processor gets their held work back at once either way.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

from processor.config.settings import Settings
from processor.telemetry.metrics import apply_relayed
from processor.transport.clock import Clock
from processor.transport.deployment import Deployment
from processor.worker.joining import JoinGate
from processor.worker.pipeline import Application
from processor.worker.service import Worker

__all__ = ["ChildSpec", "WorkerProcess", "in_process_workers"]

logger = logging.getLogger(__name__)

STOP = b"stop\n"


@dataclass(frozen=True)
class ChildSpec:
    """What the child needs to run the same workers the Host would run as threads."""

    app_ref: str  # module:attribute, imported again in the child
    settings: Settings
    instance_id: str
    workers: int
    concurrency: int | None
    recording: bool  # whether worker metrics are recorded (the parent serves /metrics)
    log_level: int
    sys_path: tuple[str, ...]  # where the parent found the application's module


def in_process_workers(
    deployment: Deployment,
    app: Application,
    instance_id: str,
    *,
    count: int,
    concurrency: int | None,
    clock: Clock,
    gate: JoinGate,
) -> list[Worker]:
    """The workers of a processor: static members named after its instance id, which
    take work once all have joined (``gate``)."""
    return [
        Worker.from_settings(
            deployment,
            app,
            concurrency=concurrency,
            worker_id=f"{instance_id}-w{index}",
            static_member=True,  # kept in the state directory: the same after a restart
            clock=clock,  # progress reports and deadline warnings: the processor's clock
            gate=gate,
        )
        for index in range(count)
    ]


class WorkerProcess:
    """The parent's handle on the child: start it, record what it sends, stop it.

    ``on_exit`` is called (on a reader thread) with the reason if the child ends while
    the Host did not ask it to stop.
    """

    def __init__(self, spec: ChildSpec, on_exit: Callable[[BaseException], None]) -> None:
        self._spec = spec
        self._on_exit = on_exit
        self._stopping = threading.Event()
        self._ready = False
        self._answered = threading.Event()  # ready, or ended before it was
        self._process: subprocess.Popen[bytes] | None = None
        self._control: int | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> None:
        child_reads, parent_writes = os.pipe()
        parent_reads, child_writes = os.pipe()
        command = [sys.executable, "-m", "processor.engine.worker_child"]
        try:
            self._process = subprocess.Popen(
                [*command, str(child_reads), str(child_writes)],
                stdin=subprocess.DEVNULL,
                pass_fds=(child_reads, child_writes),
            )
        except BaseException:
            for fd in (child_reads, parent_writes, parent_reads, child_writes):
                os.close(fd)
            raise
        os.close(child_reads)
        os.close(child_writes)
        self._control = parent_writes
        _write_all(parent_writes, pickle.dumps(self._spec))
        self._reader = threading.Thread(
            target=self._read, args=(parent_reads,), name="worker-process", daemon=True
        )
        self._reader.start()

    def wait_ready(self, timeout_s: float) -> bool:
        """Whether the child's workers have joined their group (False if it ended or did
        not say in time)."""
        self._answered.wait(timeout_s)
        return self._ready

    def stop(self, timeout_s: float) -> None:
        """Ask the child to stop (its workers drain), wait for it, kill it if it must."""
        self._stopping.set()
        if self._control is not None:
            with contextlib.suppress(OSError):  # it has ended already
                _write_all(self._control, STOP)
            os.close(self._control)
            self._control = None
        if self._process is not None:
            try:
                self._process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                logger.warning("in-process workers did not stop in %.0fs: killed", timeout_s)
                self._process.kill()
                self._process.wait()
        if self._reader is not None:
            self._reader.join(timeout_s)

    def _read(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as events:
            for line in events:
                self._received(line)
        self._answered.set()
        assert self._process is not None
        code = self._process.wait()
        if not self._stopping.is_set():
            self._on_exit(RuntimeError(f"the in-process workers' process ended (exit {code})"))

    def _received(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            logger.warning("in-process workers sent a malformed line: %r", line[:200])
            return
        if message.get("ready"):
            self._ready = True
            self._answered.set()
        observations = message.get("metrics")
        if observations:
            apply_relayed((name, tuple(labels), value) for name, labels, value in observations)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
