"""The child process of ``processor run``'s in-process workers (``worker_process.py``).

Run as ``python -m processor.engine.worker_child CONTROL_FD EVENTS_FD`` by the Host,
never by hand. It reads its ``ChildSpec`` from CONTROL_FD, runs the workers until
``stop`` (then they drain) or the parent's end (then it ends at once, like threads
of a killed process), and sends ``ready`` (once its workers have joined their group)
and its workers' metrics on EVENTS_FD.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pickle
import signal
import sys
import threading
import time
from typing import BinaryIO, TextIO

from processor.engine import heap
from processor.engine.guarded import start_guarded
from processor.engine.worker_process import STOP, ChildSpec, in_process_workers
from processor.telemetry import tracing
from processor.telemetry.logs import configure_logging
from processor.telemetry.metrics import Relay, relay_to, set_recording
from processor.transport.clock import wall_clock_ms
from processor.transport.deployment import Deployment
from processor.worker.joining import JoinGate
from processor.worker.pipeline import load_application

_PARENT_GONE = 70  # the exit code when the parent ended without asking it to stop
_RELAY_EVERY_S = 0.5
_TICK_S = 0.05  # how soon ready is said once the workers have joined


def main(control_fd: int, events_fd: int) -> int:
    control = os.fdopen(control_fd, "rb")
    events = os.fdopen(events_fd, "w", buffering=1)
    spec: ChildSpec = pickle.load(control)
    sys.path[:] = [*spec.sys_path, *(p for p in sys.path if p not in spec.sys_path)]
    configure_logging(spec.settings.log_format, spec.log_level)
    tracing.configure(spec.settings.otel, "processor")
    stop = threading.Event()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the parent, which says stop
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threading.Thread(target=_watch_parent, args=(control, stop), daemon=True).start()
    set_recording(spec.recording)
    relay = Relay()
    relay_to(relay)
    deployment = Deployment.from_settings(spec.settings)
    app = load_application(spec.app_ref)
    gate = JoinGate(spec.workers)
    workers = in_process_workers(
        deployment,
        app,
        spec.instance_id,
        count=spec.workers,
        concurrency=spec.concurrency,
        clock=wall_clock_ms,
        gate=gate,
    )
    crashed: list[BaseException] = []  # a worker's bug: they all stop, the parent too
    threads = [
        start_guarded(worker.worker_id, functools.partial(worker.run, stop), crashed, stop)
        for worker in workers
    ]
    heap.settle()  # started: the application and the workers stay for the process's life
    _relay_until_stopped(events, relay, gate, stop)
    for thread in threads:
        thread.join(30)
    _send_metrics(events, relay)
    return 1 if crashed else 0


def _relay_until_stopped(
    events: TextIO, relay: Relay, gate: JoinGate, stop: threading.Event
) -> None:
    """Say ready once every worker has joined (they take work from then on), and relay
    the workers' metrics every ``_RELAY_EVERY_S``, until ``stop``."""
    ready = False
    relay_at = time.monotonic() + _RELAY_EVERY_S
    while not stop.wait(_TICK_S):
        if not ready and gate.opened.is_set():
            _send(events, {"ready": True})
            ready = True
        if time.monotonic() >= relay_at:
            _send_metrics(events, relay)
            relay_at += _RELAY_EVERY_S


def _watch_parent(control: BinaryIO, stop: threading.Event) -> None:
    """``stop`` from the parent: drain. End of file without it: the parent died."""
    if control.readline() == STOP:
        stop.set()
        return
    os._exit(_PARENT_GONE)


def _send_metrics(events: TextIO, relay: Relay) -> None:
    taken = relay.take()
    if taken:
        _send(events, {"metrics": taken})


def _send(events: TextIO, message: dict[str, object]) -> None:
    with contextlib.suppress(OSError):  # the parent has gone: its watcher ends this process
        events.write(json.dumps(message) + "\n")


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
