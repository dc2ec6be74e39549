"""The standard workload in a closed loop: C clients, each submits a run and waits for it.

Run: ``PYTHONPATH=. python bench/closed_loop.py [--transport kafka|embedded]
[--bootstrap 127.0.0.1:9092] [--concurrency 64] [--runs 1000] [--warmup 200]
[--repeat N] [--baseline-ref COMMIT] [--broker-warmup 60] [--inline-steps]
[--fact-batches] [--no-retries] [--json]``

Workload: the bundled ``processor.examples.demo:app`` ``orders`` pipeline: validate
-> reserve_stock (fails once for one order in five: a retry after 20 ms) ->
capture_payment (an await answered by the responder process) -> invoice.
``--no-retries`` (both sides of an A/B): the clients submit only the orders that
reserve_stock does not fail, so no run waits out a backoff; the latency percentiles
then measure the engine alone, not the workload's retried fifth.

Deployment, fresh for each round (topic prefix, groups, data directory), every part
a process of its own started by bench/kafka_support.py's ``Fleet``:

- ``--transport kafka``: the processor (``python -m processor --broker kafka://...
  run --app processor.examples.demo:app --workers 0``), one worker (``python -m
  processor ... worker --app ...``) and the responder (bench/kafka_responder.py:
  the demo's payment system), as bench/kafka_standard_workload.py deploys them.
- ``--transport embedded``: the processor (``python -m processor --data-dir D run
  --app ... --workers 1``, whose worker runs in the child process ``processor run``
  starts) and the responder (``bench/kafka_responder.py --broker embedded
  --data-dir D``), sharing the SQLite log under D. ``PROCESSOR_DURABLE_FSYNC=true``
  in the environment reaches every process. ``--inline-steps``: the processor runs
  the steps itself (``PROCESSOR_INLINE_STEPS=true``, engine/inline.py; the workers
  idle), on the current tree's side only in an A/B. ``--fact-batches``: a run's facts
  of a transaction leave as one record (``PROCESSOR_FACT_BATCHES=true``,
  facts/fact_batch.py), on the current tree's side only too.

This process is the clients. The C clients are one driver thread that keeps C runs
in flight: the moment it sees a run's outcome it submits the next run
(``Client.send`` + ``flush``), so each of the C slots submits, waits for the
outcome, then submits again, with no think time: a closed loop, without 64 threads
competing with the deployment for the machine. A round runs ``--warmup`` runs in
that loop (group joins, first fetches, caches), lets them all finish, then the
``--runs`` measured ones, and lets those finish.

Figures of the measured runs:

- runs/s: runs / (first submit -> last outcome seen).
- latency: when this process saw the run's RunOutcome on runs.results minus the
  time just before it submitted the run; p50/p95/p99 by nearest rank. On Kafka a
  read_committed consumer thread sees it (``OutcomeWatcher``); on the embedded log a
  thread rereads the results partitions whenever SQLite's ``PRAGMA data_version``
  says another connection committed, which it checks every 0.5 ms.
- CPU per run: utime + stime (/proc/<pid>/stat) over the measured phase of every
  process of the deployment and each of its live descendants (the processor and,
  on the embedded log, its worker child; the worker process; the responder) and, on
  Kafka, the broker's JVM (its pid from ``compose/local-kafka status``), divided
  by the runs; per process and in total. This process (the clients) is not counted.
- transactions per run: the processor's committed transactions, the change of
  ``processor_transaction_commit_seconds_count`` on its ``/metrics`` (the loop
  observes that histogram once per transaction, after the commit returned; the
  port is read from the processor's log), divided by the runs. Nothing else
  commits a transaction on Kafka: the worker and the responder produce with an
  idempotent producer and commit consumer offsets. On the embedded log each of
  their appends and offset commits is a SQLite transaction too; those are not
  counted.
- records per run: over every topic of the deployment, the sum of the end offsets
  after minus before, divided by the runs. On the embedded log offsets are dense:
  that is the rows appended to the log's ``records`` table. On Kafka those high
  watermarks also count the control records (one commit or abort marker in each
  partition a transaction wrote to), so the records between them are consumed
  read_uncommitted (which skips control records) and counted: records = what was
  consumed, markers = offsets - records (reported as ``markers_per_run``). The
  consumer groups' offsets (``__consumer_offsets``) and the transaction log
  (``__transaction_state``) are not counted.
- ``broker_background_cpu_ms_per_s`` (Kafka): the broker's CPU per second in the 2 s
  before the round deploys. The broker may be shared: whatever else uses it while a
  round runs is in the broker's CPU per run too, and this says how much that was
  just before.

Each figure is the median over ``--repeat`` rounds (each round's figures are in the
JSON summary too). On Kafka, ``--broker-warmup`` seconds of this workload (C=64, on
a deployment of its own) run before the first round: a JVM's first minute runs cold.

A/B (``--baseline-ref COMMIT``): the commit is checked out as a git worktree in a
temporary directory, and rounds alternate current tree, baseline, current,
baseline... (``--repeat`` pairs, default 5). Each round is this script in a process
of its own with ``PYTHONPATH`` naming the tree, so that the clients, the processor,
the worker and the responder all run that tree's ``processor`` package (the
bench/ helpers are this tree's; the baseline must be recent enough to run them).
Both sides run with ``PROCESSOR_NATIVE_FOLD=false``: the compiled fold installed in
the virtualenv is built from the current tree (it only speeds up restore and
replay, which a round barely does). The summary gives each side's medians and the
ratios current / baseline.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import queue
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _support import command_line, cpus, orders, percentile
from confluent_kafka import Consumer, KafkaError
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient
from kafka_support import (
    REPO,
    SOURCE,
    Fleet,
    OutcomeWatcher,
    ProcessCpu,
    bench_settings,
    broker_pid,
    deployment_for,
    process_env,
    processor_argv,
    responder_argv,
    summary_head,
    temporary_topics,
    unique_prefix,
    worker_argv,
)

from processor.clients.client import Client, new_submit
from processor.config.settings import Settings
from processor.facts.codec import codec
from processor.facts.models import RunOutcome
from processor.facts.topics import TopicName
from processor.transport.base import Reader, TopicPartition
from processor.transport.deployment import Deployment
from processor.transport.embedded import EmbeddedTransport

#: One outcome as a client sees it: the RunOutcome and when it was seen (epoch ms).
Arrival = tuple[RunOutcome, float]
#: The figures compared between rounds and sides (medians, ratios).
FIGURES = ("runs_per_s", "p50_ms", "p95_ms", "p99_ms", "transactions_per_run", "records_per_run")
_TRANSACTIONS = re.compile(rb"^processor_transaction_commit_seconds_count (\S+)$", re.M)
_SERVING = re.compile(r"http: serving on (\S+)")


# --- watching outcomes on the embedded log ------------------------------------------------


class LogOutcomes:
    """Reads runs.results of the embedded log on a thread, from its end at creation,
    and puts each run's first outcome on ``arrivals`` with the time it was seen."""

    def __init__(self, deployment: Deployment, arrivals: queue.SimpleQueue[Arrival]) -> None:
        self._deployment = deployment
        self._arrivals = arrivals
        topic = deployment.topology.name(TopicName.OUTCOMES)
        self._tps = [TopicPartition(topic, p) for p in range(deployment.topology.partitions)]
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(30)

    def _run(self) -> None:
        transport = self._deployment.transport
        assert isinstance(transport, EmbeddedTransport)
        reader = transport.reader()  # a connection of this thread's own
        version = sqlite3.connect(f"file:{transport.db_file}?mode=ro", uri=True)
        try:
            positions = {tp: reader.end_offset(tp) for tp in self._tps}
            self._ready.set()
            self._follow(reader, version, positions)
        except BaseException as exc:  # surfaced by check()
            self._error.append(exc)
        finally:
            self._ready.set()
            version.close()
            reader.close()

    def _follow(
        self, reader: Reader, version: sqlite3.Connection, positions: dict[TopicPartition, int]
    ) -> None:
        decode = codec().decode_as
        seen: set[str] = set()
        last = None
        while not self._stop.is_set():
            current = version.execute("PRAGMA data_version").fetchone()[0]
            if current == last:
                time.sleep(0.0005)  # SQLite has no change notification across processes
                continue
            last = current
            for tp, start in positions.items():
                for batch in reader.read(tp, start):
                    now = time.time() * 1000
                    for record in batch:
                        outcome = decode(record.value, RunOutcome)
                        if outcome.run_id not in seen:
                            seen.add(outcome.run_id)
                            self._arrivals.put((outcome, now))
                        positions[tp] = record.offset + 1

    def check(self) -> None:
        if self._error:
            raise RuntimeError("reading outcomes failed") from self._error[0]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


# --- a deployment and its counters --------------------------------------------------------


@dataclass
class Running:
    """One round's deployment, its clients' producer and the outcomes they wait for."""

    settings: Settings
    deployment: Deployment
    fleet: Fleet
    client: Client
    arrivals: queue.SimpleQueue[Arrival]
    alive: Callable[[], None]
    bootstrap: str | None  # None: the embedded log
    broker: int | None  # the broker's pid (Kafka)
    orders: Iterator[dict[str, Any]]

    def submit(self, count: int, pending: dict[str, float]) -> None:
        """Submit ``count`` orders and flush; note when each was submitted (epoch ms)."""
        for _ in range(count):
            command = new_submit("orders", next(self.orders))
            pending[command.run_id] = time.time() * 1000
            self.client.send(command)
        self.client.flush()

    def cpu(self) -> dict[str, dict[int, float]]:
        """Process name -> pid -> CPU seconds, over each process's tree."""
        pids = {name: process.pid for name, process in self.fleet.processes.items()}
        if self.broker is not None:
            pids["broker"] = self.broker
        return {name: ProcessCpu(pid).tree_seconds() for name, pid in pids.items()}

    def transactions(self) -> int | None:
        """The processor's committed transactions so far (None if it serves no metric)."""
        deadline = time.monotonic() + 30  # its server starts beside the loop: wait for it
        while (address := self._serving()) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if address is None:
            return None
        with urllib.request.urlopen(f"{address.group(1)}/metrics", timeout=10) as response:
            found = _TRANSACTIONS.search(response.read())
        return None if found is None else round(float(found.group(1)))

    def _serving(self) -> re.Match[str] | None:
        """Where the processor's HTTP server listens, once its log says so."""
        log = (self.fleet.logs / "processor.log").read_text(errors="replace")
        return _SERVING.search(log)

    def topic_ends(self) -> dict[tuple[str, int], int]:
        """(topic, partition) -> end offset, over every topic of the deployment."""
        if self.bootstrap is not None:
            return kafka_high_watermarks(self.bootstrap, self.settings.topic_prefix)
        admin = self.deployment.transport.admin()
        reader = self.deployment.transport.reader()
        try:
            specs = admin.describe_topics()
            return {
                (name, p): reader.end_offset(TopicPartition(name, p))
                for name, spec in specs.items()
                for p in range(spec.partitions)
            }
        finally:
            reader.close()
            admin.close()


@contextlib.contextmanager
def deployed(
    transport: str,
    bootstrap: str,
    root: Path,
    *,
    inline_steps: bool = False,
    fact_batches: bool = False,
    no_retries: bool = False,
) -> Iterator[Running]:
    """A fresh deployment of the demo app on ``transport`` (see the module doc)."""
    kafka = transport == "kafka"
    prefix = unique_prefix("closed")
    settings = bench_settings(bootstrap if kafka else None, prefix, root / "data")
    topics = temporary_topics(bootstrap, prefix) if kafka else contextlib.nullcontext()
    with topics:
        deployment = deployment_for(settings)
        env = process_env(settings)
        if inline_steps:
            env["PROCESSOR_INLINE_STEPS"] = "true"
        if fact_batches:
            env["PROCESSOR_FACT_BATCHES"] = "true"
        fleet = Fleet(root / "logs")
        arrivals: queue.SimpleQueue[Arrival] = queue.SimpleQueue()
        watcher: OutcomeWatcher | LogOutcomes
        if kafka:
            topic = deployment.topology.name(TopicName.OUTCOMES)
            parts = deployment.topology.partitions
            watcher = OutcomeWatcher(bootstrap, topic, parts, arrivals=arrivals)
        else:
            watcher = LogOutcomes(deployment, arrivals)
        client = Client(deployment.transport, deployment.topology, settings.state_dir)

        def alive() -> None:
            fleet.check()
            if isinstance(watcher, LogOutcomes):
                watcher.check()

        try:
            fleet.start("processor", processor_argv(settings, workers=0 if kafka else 1), env)
            if kafka:
                fleet.start("worker0", worker_argv(settings), env)
            fleet.start("responder", responder_argv(settings), env)
            broker = broker_pid() if kafka else None
            yield Running(
                settings,
                deployment,
                fleet,
                client,
                arrivals,
                alive,
                bootstrap if kafka else None,
                broker,
                orders(no_retries=no_retries),
            )
        finally:
            fleet.stop()
            client.close()
            watcher.close()


def kafka_high_watermarks(bootstrap: str, prefix: str) -> dict[tuple[str, int], int]:
    """(topic, partition) -> high watermark (control records included) of ``prefix``'s topics."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    topics = admin.list_topics(timeout=30).topics
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex}",  # never joined: watermarks only
            "isolation.level": "read_uncommitted",
        }
    )
    try:
        return {
            (name, p): consumer.get_watermark_offsets(
                KafkaTopicPartition(name, p), timeout=10, cached=False
            )[1]
            for name, topic in topics.items()
            if name.startswith(prefix)
            for p in topic.partitions
        }
    finally:
        consumer.close()


def kafka_records(
    bootstrap: str, before: dict[tuple[str, int], int], after: dict[tuple[str, int], int]
) -> int:
    """The data records between ``before`` and ``after`` (control records skipped)."""
    ranges = {tp: (before.get(tp, 0), end) for tp, end in after.items()}
    ranges = {tp: span for tp, span in ranges.items() if span[1] > span[0]}
    if not ranges:
        return 0
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex}",  # never joined: assign only
            "isolation.level": "read_uncommitted",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([KafkaTopicPartition(t, p, start) for (t, p), (start, _) in ranges.items()])
    count = 0
    at_end: set[tuple[str, int]] = set()
    deadline = time.monotonic() + 120
    try:
        while len(at_end) < len(ranges):
            if time.monotonic() > deadline:
                raise TimeoutError(f"counting records: {len(at_end)} of {len(ranges)} read")
            for msg in consumer.consume(10_000, 0.5):
                tp = (str(msg.topic()), int(msg.partition() or 0))
                error = msg.error()
                if error is not None and error.code() == KafkaError._PARTITION_EOF:
                    at_end.add(tp)
                elif error is None and int(msg.offset() or 0) < ranges[tp][1]:
                    count += 1
    finally:
        consumer.close()
    return count


# --- the closed loop ----------------------------------------------------------------------


def closed_loop(running: Running, runs: int, concurrency: int, timeout_s: float) -> dict[str, Any]:
    """``runs`` runs, ``concurrency`` in flight: each outcome seen submits the next run."""
    pending: dict[str, float] = {}
    latencies: list[float] = []
    succeeded = 0
    started = time.perf_counter()
    deadline = time.monotonic() + timeout_s
    running.submit(min(concurrency, runs), pending)
    submitted = min(concurrency, runs)
    while len(latencies) < runs:
        try:
            arrived = [running.arrivals.get(timeout=0.5)]
        except queue.Empty:
            running.alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(latencies)} of {runs} runs in {timeout_s}s") from None
            continue
        with contextlib.suppress(queue.Empty):
            while True:
                arrived.append(running.arrivals.get_nowait())
        for outcome, seen in arrived:
            sent = pending.pop(outcome.run_id, None)
            if sent is not None:
                latencies.append(seen - sent)
                succeeded += outcome.status == "succeeded"
        more = min(runs - submitted, concurrency - len(pending))
        if more > 0:
            running.submit(more, pending)
            submitted += more
    seconds = time.perf_counter() - started
    latencies.sort()
    return {
        "runs": runs,
        "succeeded": succeeded,
        "failed": runs - succeeded,
        "seconds": round(seconds, 3),
        "runs_per_s": runs / seconds,
        "p50_ms": percentile(latencies, 0.50),
        "p95_ms": percentile(latencies, 0.95),
        "p99_ms": percentile(latencies, 0.99),
    }


def measure_round(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """One round on a fresh deployment: warm-up runs, then the measured ones, counted."""
    background = broker_background(args.transport)
    with deployed(
        args.transport,
        args.bootstrap,
        root,
        inline_steps=args.inline_steps,
        fact_batches=args.fact_batches,
        no_retries=args.no_retries,
    ) as running:
        closed_loop(running, args.warmup, args.concurrency, args.timeout)
        cpu_before = running.cpu()
        transactions_before = running.transactions()
        ends_before = running.topic_ends()
        result = closed_loop(running, args.runs, args.concurrency, args.timeout)
        cpu_after = running.cpu()
        time.sleep(0.5)  # the last commit markers and metric updates land after the outcome
        transactions_after = running.transactions()
        ends_after = running.topic_ends()
        offsets = sum(ends_after.values()) - sum(ends_before.get(tp, 0) for tp in ends_after)
        if running.bootstrap is not None:  # before the topics go with the deployment
            records = kafka_records(running.bootstrap, ends_before, ends_after)
            markers: int | None = offsets - records
        else:
            records, markers = offsets, None
    cpu: dict[str, float] = {}
    for name, pids in cpu_after.items():  # the first pid is the process, then its descendants
        used = [s - cpu_before.get(name, {}).get(pid, 0.0) for pid, s in pids.items()]
        cpu[name] = used[0]
        if len(used) > 1:
            cpu[f"{name}_children"] = sum(used[1:])
    cpu["total"] = sum(cpu.values())
    runs = args.runs
    transactions = (
        None
        if transactions_before is None or transactions_after is None
        else transactions_after - transactions_before
    )
    return {
        **{k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()},
        "cpu_ms_per_run": {name: round(1000 * s / runs, 3) for name, s in cpu.items()},
        "transactions_per_run": None if transactions is None else round(transactions / runs, 3),
        "records_per_run": round(records / runs, 3),
        "markers_per_run": None if markers is None else round(markers / runs, 3),
        "broker_background_cpu_ms_per_s": background,
    }


def broker_background(transport: str, seconds: float = 2.0) -> float | None:
    """The broker's CPU (ms per second) while none of this round runs: the broker is
    shared, and what others make it do is in its CPU per run too."""
    pid = broker_pid() if transport == "kafka" else None
    if pid is None:
        return None
    cpu = ProcessCpu(pid)
    before = cpu.seconds()
    time.sleep(seconds)  # sampling an interval
    return round(1000 * (cpu.seconds() - before) / seconds, 1)


def warm_broker(args: argparse.Namespace, root: Path, say: Callable[[str], None]) -> None:
    """Run the workload at C=64 for ``--broker-warmup`` seconds on a throwaway deployment."""
    if args.transport != "kafka" or args.broker_warmup <= 0:
        return
    started = time.perf_counter()
    done = 0
    with deployed(args.transport, args.bootstrap, root / "broker-warmup") as running:
        while time.perf_counter() - started < args.broker_warmup:
            closed_loop(running, 200, 64, args.timeout)
            done += 200
    say(f"broker warm-up: {done} runs in {time.perf_counter() - started:.0f}s")


def medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each figure over ``rounds`` (None where a round has none)."""
    out: dict[str, Any] = {}
    for figure in (*FIGURES, "markers_per_run", "broker_background_cpu_ms_per_s"):
        values = [r[figure] for r in rounds if r[figure] is not None]
        out[figure] = round(statistics.median(values), 3) if values else None
    names = {name for r in rounds for name in r["cpu_ms_per_run"]}
    out["cpu_ms_per_run"] = {
        name: round(statistics.median(r["cpu_ms_per_run"].get(name, 0.0) for r in rounds), 3)
        for name in sorted(names)
    }
    return out


def describe(name: str, figures: dict[str, Any]) -> str:
    cpu = figures["cpu_ms_per_run"]
    parts = ", ".join(f"{k} {v:.2f}" for k, v in cpu.items() if k != "total")
    return (
        f"{name}: {figures['runs_per_s']:,.1f} runs/s; p50 {figures['p50_ms']:.1f} ms, "
        f"p95 {figures['p95_ms']:.1f}, p99 {figures['p99_ms']:.1f}; CPU {cpu['total']:.2f} "
        f"ms/run ({parts}); {figures['transactions_per_run']} transactions/run, "
        f"{figures['records_per_run']} records/run"
        + (f", {figures['markers_per_run']} markers/run" if figures["markers_per_run"] else "")
        + (
            f"; broker alone {figures['broker_background_cpu_ms_per_s']} ms/s"
            if figures["broker_background_cpu_ms_per_s"] is not None
            else ""
        )
    )


# --- A/B against another commit -----------------------------------------------------------


@contextlib.contextmanager
def checkout(ref: str, root: Path) -> Iterator[tuple[Path, str]]:
    """``ref`` checked out as a detached git worktree under ``root``; (its path, commit)."""
    tree = root / "baseline-tree"
    git = ["git", "-C", str(REPO)]
    commit = subprocess.run(
        [*git, "rev-parse", "--verify", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    subprocess.run(
        [*git, "worktree", "add", "--detach", str(tree), commit], check=True, capture_output=True
    )
    try:
        yield tree, commit
    finally:
        subprocess.run(
            [*git, "worktree", "remove", "--force", str(tree)], check=False, capture_output=True
        )


def round_in(tree: Path, args: argparse.Namespace, *, current: bool) -> dict[str, Any]:
    """One round of this script in its own process, running ``tree``'s processor."""
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        *("--transport", args.transport, "--bootstrap", args.bootstrap),
        *("--concurrency", str(args.concurrency), "--runs", str(args.runs)),
        *("--warmup", str(args.warmup), "--timeout", str(args.timeout)),
        *("--repeat", "1", "--broker-warmup", "0", "--json"),
        *(["--inline-steps"] if current and args.inline_steps else []),
        *(["--fact-batches"] if current and args.fact_batches else []),
        *(["--no-retries"] if args.no_retries else []),
    ]
    env = dict(os.environ) | {"PYTHONPATH": str(tree), "PROCESSOR_NATIVE_FOLD": "false"}
    done = subprocess.run(argv, env=env, cwd=tree, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"a round in {tree} exited {done.returncode} (a baseline must be recent enough "
            f"to run this tree's bench/ helpers):\n{done.stderr[-4000:]}"
        )
    summary: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if summary.get("broker_restarted"):
        raise RuntimeError("the broker restarted during a round; its figures are not valid")
    if summary["source"] != str(tree):
        raise RuntimeError(f"a round meant for {tree} ran {summary['source']}")
    rounds: list[dict[str, Any]] = summary["per_round"]
    return rounds[0]


def compare(args: argparse.Namespace, root: Path, say: Callable[[str], None]) -> dict[str, Any]:
    """Alternate rounds of this tree and of ``--baseline-ref``; medians and ratios."""
    sides: dict[str, list[dict[str, Any]]] = {"current": [], "baseline": []}
    with checkout(args.baseline_ref, root) as (baseline, commit):
        say(f"baseline: {args.baseline_ref} = {commit[:12]}, checked out in {baseline}")
        warm_broker(args, root, say)
        for index in range(args.repeat):
            for side, tree in (("current", REPO), ("baseline", baseline)):
                result = round_in(tree, args, current=tree == REPO)
                sides[side].append(result)
                say(describe(f"round {index + 1} {side}", result))
    current, base = medians(sides["current"]), medians(sides["baseline"])
    ratios = {
        figure: round(current[figure] / base[figure], 3)
        for figure in FIGURES
        if current[figure] is not None and base[figure]
    }
    if base["cpu_ms_per_run"].get("total"):
        total = current["cpu_ms_per_run"]["total"] / base["cpu_ms_per_run"]["total"]
        ratios["cpu_ms_per_run"] = round(total, 3)
    say(describe("current (median)", current))
    say(describe("baseline (median)", base))
    say(f"current / baseline: {ratios}")
    return {
        "baseline_ref": args.baseline_ref,
        "baseline_commit": commit,
        "native_fold": False,
        "current": {**current, "per_round": sides["current"]},
        "baseline": {**base, "per_round": sides["baseline"]},
        "ratios": ratios,
    }


def foreign_modules() -> list[str]:
    """Loaded ``processor`` modules from outside ``SOURCE``: an editable install fills in
    what another tree (a baseline) lacks from this one, which would mix the two."""
    files = (
        getattr(module, "__file__", None)
        for name, module in list(sys.modules.items())
        if name == "processor" or name.startswith("processor.")
    )
    return sorted(f for f in files if f and not Path(f).resolve().is_relative_to(SOURCE))


def main() -> None:
    if foreign := foreign_modules():
        sys.exit(f"processor modules from outside {SOURCE}: {foreign[:3]}; a tree too old?")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transport", choices=("kafka", "embedded"), default="kafka")
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--concurrency", type=int, default=64, help="clients (runs in flight)")
    parser.add_argument("--runs", type=int, default=1_000, help="measured runs a round")
    parser.add_argument("--warmup", type=int, default=200, help="runs before those, a round")
    parser.add_argument("--repeat", type=int, help="rounds (A/B: pairs); default 5 A/B, else 1")
    parser.add_argument("--baseline-ref", help="a commit to compare with, alternating rounds")
    parser.add_argument("--broker-warmup", type=float, default=60.0, help="seconds (Kafka)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a phase")
    parser.add_argument(
        "--inline-steps",
        action="store_true",
        help="the processor runs the steps itself (PROCESSOR_INLINE_STEPS; current tree only)",
    )
    parser.add_argument(
        "--fact-batches",
        action="store_true",
        help="a run's facts of a transaction as one record (PROCESSOR_FACT_BATCHES; "
        "current tree only)",
    )
    parser.add_argument(
        "--no-retries",
        action="store_true",
        help="submit only the demo's orders that no step fails (both sides of an A/B)",
    )
    parser.add_argument("--json", action="store_true", help="only the one-line JSON summary")
    args = parser.parse_args()
    if args.repeat is None:
        args.repeat = 5 if args.baseline_ref else 1
    say = (lambda *_: None) if args.json else functools.partial(print, flush=True)
    command = command_line(sys.argv)
    say(f"$ {command}")
    broker = broker_pid() if args.transport == "kafka" else None
    root = Path(tempfile.mkdtemp(prefix="bench-closed-loop-"))
    try:
        if args.baseline_ref:
            figures = compare(args, root, say)
        else:
            warm_broker(args, root, say)
            rounds = []
            for index in range(args.repeat):
                rounds.append(measure_round(args, root / f"round-{index}"))
                say(describe(f"round {index + 1}", rounds[-1]))
            figures = {**medians(rounds), "per_round": rounds}
            if args.repeat > 1:
                say(describe("median", figures))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.transport == "kafka":
        head = summary_head("closed_loop", broker, say)
    else:
        head = {
            "bench": "closed_loop",
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "cpus": cpus(),
            "broker_restarted": False,
        }
    environment = Settings()
    summary = {
        **head,
        "transport": args.transport,
        "concurrency": args.concurrency,
        "runs": args.runs,
        "warmup": args.warmup,
        "rounds": args.repeat,
        "broker_warmup_s": args.broker_warmup if args.transport == "kafka" else 0,
        "source": str(SOURCE),
        "durable_fsync": environment.durable_fsync,
        # as the current side ran: by the flag, or by the setting in the environment
        "inline_steps": args.inline_steps or environment.inline_steps,
        "fact_batches": args.fact_batches or environment.fact_batches,
        "no_retries": args.no_retries,
        **figures,
        "command": command,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
