"""Shared by the embedded-log benchmarks: the demo engine, outcome collection, /proc reads.

The engine is what ``processor demo`` runs (``processor.examples.demo_runner.run_demo``): a
``processor.engine.host.Host`` (processor loop + in-process worker threads) with the
bundled ``processor.examples.demo:app``, plus the demo's external-system
simulator (``processor.clients.external.Responder``) answering the pipeline's await
steps, when the example has them. Unlike the demo it sends no duplicate or
forged completions.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import itertools
import os
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from processor.clients.client import Client, new_submit
from processor.config.settings import Settings
from processor.engine.host import Host
from processor.facts.codec import codec
from processor.facts.models import RunOutcome
from processor.facts.topics import TopicName
from processor.store.rocks import COLUMN_FAMILIES, PartitionStore, store_path
from processor.transport.base import Reader, TopicPartition
from processor.transport.deployment import Deployment

APP = "processor.examples.demo"
MIB = 1024 * 1024


def cpus() -> int:
    return len(os.sched_getaffinity(0))


def bench_dir_on_pythonpath() -> None:
    """Put bench/ on PYTHONPATH, so that the processor's worker child process imports a
    bench's own app module (``app_host``'s ``app_ref``) as this process does."""
    paths = [str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, paths))


def printer(quiet: bool) -> Callable[[str], None]:
    """A bench's progress printer: silent under ``--json``."""

    def say(text: str) -> None:
        if not quiet:
            print(text, flush=True)

    return say


def rounds_parser(
    doc: str | None, *, repeat: int, timeout_s: float, timed: str
) -> argparse.ArgumentParser:
    """The options of a bench of alternated rounds: ``--repeat``, ``--timeout`` (the
    seconds that ``timed`` may take) and ``--json``; the bench adds its own."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=repeat, help="alternated rounds")
    parser.add_argument(
        "--timeout", type=float, default=timeout_s, help=f"seconds {timed} may take"
    )
    parser.add_argument("--json", action="store_true", help="print only the JSON summary")
    return parser


def begin(args: argparse.Namespace) -> tuple[str, Callable[[str], None]]:
    """The command that makes the figures and the progress printer; the command said,
    and bench/ on the worker child's path (set a bench's environment before)."""
    command = command_line(sys.argv)
    bench_dir_on_pythonpath()
    say = printer(args.json)
    say(command)
    return command, say


def command_line(argv: list[str]) -> str:
    """The command that produced a figure, as it can be pasted from the repo root."""
    return "PYTHONPATH=. python " + " ".join(argv)


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of a sorted list (the rule processor.examples.demo_runner uses)."""
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, round(fraction * (len(sorted_values) - 1)))
    return float(sorted_values[index])


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon and RssFile of ``pid`` in bytes, from /proc/<pid>/status."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in {"VmRSS", "VmHWM", "RssAnon", "RssFile"}:
            out[name] = int(value.split()[0]) * 1024
    return out


def demo_app() -> tuple[Any, dict[str, Any]]:
    """The example application and the handlers ``processor demo`` answers its awaits with."""
    module = importlib.import_module(APP)
    handlers = {}
    if hasattr(module, "payments_simulator"):
        handlers["payments"] = module.payments_simulator
    return module.app, handlers


def order(index: int) -> dict[str, Any]:
    """The demo's order number ``index`` (one in five fails once in reserve_stock)."""
    return {"order_id": f"order-{index:07d}", "amount": 10 + index % 90}


def refused_once(order_id: str) -> bool:
    """Whether the demo's ``reserve_stock`` fails this order once (the rule of
    processor/examples/demo.py; tests/bench/test_bench_orders.py holds the two together)."""
    return zlib.crc32(order_id.encode()) % 5 == 0


def orders(*, no_retries: bool = False) -> Iterator[dict[str, Any]]:
    """The demo's orders in turn; with ``no_retries`` only those no step fails, so that
    no run waits for a retry."""
    for index in itertools.count():
        placed = order(index)
        if not (no_retries and refused_once(placed["order_id"])):
            yield placed


@dataclass
class Engine:
    deployment: Deployment
    host: Host

    @property
    def settings(self) -> Settings:
        return self.deployment.settings


@contextmanager
def engine(data_dir: Path, workers: int, group: str | None = None) -> Iterator[Engine]:
    """A running demo engine on a fresh embedded log under ``data_dir``."""
    settings = Settings(data_dir=data_dir, group=group or f"bench-{uuid.uuid4().hex[:8]}")
    deployment = Deployment.from_settings(settings)
    app, handlers = demo_app()
    host = Host(deployment, app, workers=workers, app_ref=f"{APP}:app")  # as processor demo
    responding = None
    try:
        host.start()
        host.workers_ready(60)  # the child process's start is not part of a figure
        if handlers:
            from processor.clients.external import Responder

            responder = Responder(deployment.transport, deployment.topology, handlers)
            responding = threading.Thread(
                target=responder.run, args=(host.stop_event,), daemon=True
            )
            responding.start()
        yield Engine(deployment, host)
    finally:
        host.stop()
        if responding is not None:
            responding.join(10)
    if host.errors:
        raise host.errors[0]


@contextmanager
def app_host(data_dir: Path, application: Any, app_ref: str) -> Iterator[tuple[Deployment, Client]]:
    """``application`` run as ``processor run`` runs it (2 workers at the default
    concurrency, in their child process, which imports ``app_ref``) on a fresh embedded
    log, and a client of it; the child's start is not part of a figure."""
    settings = Settings(data_dir=data_dir, group=f"bench-{uuid.uuid4().hex[:8]}")
    deployment = Deployment.from_settings(settings)
    host = Host(deployment, application, app_ref=app_ref)
    host.start()
    # Imported here: a baseline tree from before it still runs the other helpers (A/B).
    from processor.engine import heap

    heap.settle()  # as ``processor run`` does once started
    try:
        host.workers_ready(60)
        client = Client(deployment.transport, deployment.topology, settings.state_dir)
        try:
            yield deployment, client
        finally:
            client.close()
    finally:
        host.stop()
    if host.errors:
        raise host.errors[0]


def timed_run(client: Client, deployment: Deployment, pipeline: str, timeout_s: float) -> float:
    """Submit one run of ``pipeline`` and wait for it: its submit-to-terminal ms."""
    outcomes = Outcomes(deployment)
    try:
        client.send(new_submit(pipeline, {"x": 1}))
        client.flush()
        [outcome] = outcomes.collect(1, timeout_s)
    finally:
        outcomes.close()
    if outcome.status != "succeeded":
        raise RuntimeError(f"a {pipeline} run ended {outcome.status}: {outcome.error}")
    return float(outcome.finished_ms - outcome.submitted_ms)


class Outcomes:
    """Reads RunOutcomes from runs.results, from the end it had when created."""

    def __init__(self, deployment: Deployment) -> None:
        self.reader: Reader = deployment.transport.reader()
        topic = deployment.topology.name(TopicName.OUTCOMES)
        parts = range(deployment.topology.partitions)
        self.positions = {
            tp: self.reader.end_offset(tp) for tp in (TopicPartition(topic, p) for p in parts)
        }
        self.count = 0

    def count_new(self) -> int:
        """Advance over new outcomes without decoding them (one per run); the total."""
        for tp, start in self.positions.items():
            end = self.reader.end_offset(tp)
            if end > start:
                self.count += end - start
                self.positions[tp] = end
        return self.count

    def collect(self, expected: int, timeout_s: float) -> list[RunOutcome]:
        """Decode outcomes until ``expected`` distinct runs have one."""
        outcomes: dict[str, RunOutcome] = {}
        deadline = time.monotonic() + timeout_s
        while len(outcomes) < expected:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(outcomes)} of {expected} runs finished in {timeout_s}s")
            progressed = False
            for tp, start in self.positions.items():
                for batch in self.reader.read(tp, start):
                    for record in batch:
                        outcome = codec().decode_as(record.value, RunOutcome)
                        outcomes[outcome.run_id] = outcome
                        self.positions[tp] = record.offset + 1
                        progressed = True
            if not progressed:
                time.sleep(0.01)  # polling the results topic
        self.count = len(outcomes)
        return list(outcomes.values())

    def close(self) -> None:
        self.reader.close()


def submit(client: Client, first: int, count: int) -> None:
    """Submit orders ``first .. first + count - 1`` and flush."""
    for index in range(first, first + count):
        client.send(new_submit("orders", order(index)))
    client.flush()


def facts_in_log(deployment: Deployment) -> int:
    reader = deployment.transport.reader()
    try:
        topic = deployment.topology.name(TopicName.FACTS)
        parts = range(deployment.topology.partitions)
        return sum(reader.end_offset(TopicPartition(topic, p)) for p in parts)
    finally:
        reader.close()


def machine_cpu_seconds() -> float:
    """CPU seconds every process on this machine has used so far (``/proc/stat``).

    Counts what a per-process clock misses: the replay's pool processes (forked by a
    fork server, so not children of the bench) and, on Kafka, the broker's work for
    the read. The benches run alone on their machine.
    """
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def per_cpu_second(count: int, cpu_seconds: float) -> float:
    """``count`` per CPU-second, for CPU read from ``machine_cpu_seconds``.

    That clock counts in ticks (1/``SC_CLK_TCK`` s): a stretch shorter than one tick
    (a tiny smoke run) is counted as one tick rather than divided by zero.
    """
    return count / max(cpu_seconds, 1 / os.sysconf("SC_CLK_TCK"))


def digest(root: Path, partitions: int) -> dict[str, str]:
    """SHA-256 over every (key, value) of every column family of the stores under ``root``."""
    out = {}
    for family in COLUMN_FAMILIES:
        h = hashlib.sha256()
        for partition in range(partitions):
            store = PartitionStore(store_path(root, partition), read_only=True)
            try:
                for key, value in store.items(family):
                    h.update(len(key).to_bytes(4, "big") + key)
                    h.update(len(value).to_bytes(4, "big") + value)
            finally:
                store.close()
        out[family] = h.hexdigest()
    return out
