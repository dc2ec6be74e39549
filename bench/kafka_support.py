"""Shared by the Kafka benchmarks: a deployment in separate processes, baselines, cleanup.

- ``Fleet`` starts the engine as real processes, each the way an operator would:
  ``python -m processor --broker ... run --app processor.examples.demo:app --workers 0``
  (the processor alone), ``python -m processor --broker ... worker --app ...`` (one
  worker process) and ``python bench/kafka_responder.py`` (the demo's payment system:
  ``processor.clients.external.Responder`` with ``processor.examples.demo.payments_simulator``).
  Every run uses a fresh topic prefix, consumer groups and state directory, and the
  topics are deleted at the end.
- ``OutcomeWatcher`` consumes ``runs.results`` on a thread (read_committed) and
  remembers when each RunOutcome became visible.
- ``raw_round_trip`` is the same-run baseline: records produced through one topic
  (by a transactional producer committing batches, like the processor, or by a
  plain idempotent producer, like a client) and consumed read_committed; records/s
  and produce-to-visible latency from each record's CreateTime.
- ``ProcessCpu`` reads utime+stime of a process (and, with ``tree_seconds``, of its
  live descendants) from /proc, to report CPU per run.

The processes run the ``processor`` package this process imports (``SOURCE``, the
repository by default; another checkout when ``PYTHONPATH`` names one, as
bench/closed_loop.py's A/B mode does), and every helper also deploys on the embedded
log when given no bootstrap.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _support import cpus, order, percentile
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

import processor
from processor.clients.client import Client, new_submit
from processor.config.settings import Settings
from processor.facts.codec import codec
from processor.facts.models import RunOutcome
from processor.facts.topics import TopicName
from processor.transport.base import TopicPartition
from processor.transport.deployment import Deployment, ensure_topics
from processor.transport.kafka import PRODUCER_CONFIG
from processor.transport.kafka_common import wait_for_first
from processor.transport.kafka_stable import StableOffsets
from processor.worker.pipeline import load_application

APP = "processor.examples.demo:app"
#: The resume-token HMAC key shared by the processor and the tests' clients (>= 16 chars).
SECRET = "bench-resume-secret-0123456789abcdef"
REPO = Path(__file__).resolve().parent.parent
#: The source tree of the ``processor`` package imported here; the processes run it too.
SOURCE = Path(processor.__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


def unique_prefix(kind: str) -> str:
    """A topic prefix (and group/transactional-id stem) no other run shares."""
    return f"bench-{kind}-{uuid.uuid4().hex[:8]}."


def bench_settings(
    bootstrap: str | None, prefix: str, data_dir: Path, registry: str | None = None
) -> Settings:
    """A deployment's settings: on Kafka at ``bootstrap``, or on the embedded log
    under ``data_dir`` when it is None."""
    stem = prefix.rstrip(".")
    return Settings(
        broker=f"kafka://{bootstrap}" if bootstrap else None,
        topic_prefix=prefix,
        data_dir=data_dir,
        group=f"{stem}-processor",
        worker_group=f"{stem}-workers",
        resume_secret=SECRET,
        schema_registry_url=registry,
    )


def process_env(settings: Settings) -> dict[str, str]:
    """The environment that makes a ``processor`` process use ``settings``."""
    env = dict(os.environ)
    env |= {
        "PYTHONPATH": str(SOURCE),
        "PROCESSOR_BROKER": settings.broker or "",
        "PROCESSOR_TOPIC_PREFIX": settings.topic_prefix,
        "PROCESSOR_DATA_DIR": str(settings.data_dir),
        "PROCESSOR_GROUP": settings.group,
        "PROCESSOR_WORKER_GROUP": settings.worker_group,
        "PROCESSOR_RESUME_SECRET": SECRET,
        "PROCESSOR_PARTITIONS": str(settings.partitions),
        "PROCESSOR_HTTP_PORT": "0",  # several processes side by side: each on a free port
    }
    if settings.schema_registry_url:
        env["PROCESSOR_SCHEMA_REGISTRY_URL"] = settings.schema_registry_url
    return env


def _processor_cli(settings: Settings) -> list[str]:
    """``python -m processor`` with the deployment's global options (no ``--broker``
    on the embedded log)."""
    broker = ["--broker", settings.broker] if settings.broker else []
    return [
        sys.executable,
        "-m",
        "processor",
        *broker,
        "--topic-prefix",
        settings.topic_prefix,
        "--data-dir",
        str(settings.data_dir),
    ]


def processor_argv(settings: Settings, workers: int = 0) -> list[str]:
    """``processor run``, by default without in-process workers (the command line
    documented in README); with ``workers``, they run in one child process."""
    return [*_processor_cli(settings), "run", "--app", APP, "--workers", str(workers)]


def worker_argv(settings: Settings, threads: int = 1) -> list[str]:
    return [
        *_processor_cli(settings),
        "worker",
        "--app",
        APP,
        "--threads",
        str(threads),
    ]


def responder_argv(settings: Settings) -> list[str]:
    return [
        sys.executable,
        str(BENCH / "kafka_responder.py"),
        "--broker",
        settings.broker or "embedded",
        "--data-dir",
        str(settings.data_dir),
        "--topic-prefix",
        settings.topic_prefix,
        "--group",
        f"{settings.topic_prefix.rstrip('.')}-responders",
    ]


class ProcessCpu:
    """utime + stime of one process, in seconds (from /proc/<pid>/stat)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def seconds(self) -> float:
        return _cpu_seconds(self.pid)

    def tree_seconds(self) -> dict[int, float]:
        """pid -> CPU seconds of this process and each of its live descendants (a
        ``processor run``'s worker process, say); a caller diffs two of these by pid."""
        out = {}
        pending = [self.pid]
        while pending:
            pid = pending.pop()
            out[pid] = _cpu_seconds(pid)
            pending.extend(_children(pid))
        return out


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _children(pid: int) -> list[int]:
    """The live children of ``pid`` (every thread's /proc/<pid>/task/<tid>/children)."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found.extend(int(c) for c in (task / "children").read_text().split())
    return found


@dataclass
class Fleet:
    """Processes of one deployment; stopped (SIGTERM, then SIGKILL) by their own pids."""

    logs: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = (self.logs / f"{name}.log").open("wb")
        self.processes[name] = subprocess.Popen(
            argv, env=env, cwd=SOURCE, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()

    def cpu(self) -> dict[str, float]:
        return {name: ProcessCpu(p.pid).seconds() for name, p in self.processes.items()}

    def check(self) -> None:
        """Raise if a process died (with the end of its log)."""
        for name, process in self.processes.items():
            if process.poll() is not None:
                tail = (self.logs / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited with {process.returncode}:\n{tail}")

    def stop(self, name: str | None = None, timeout_s: float = 30.0) -> None:
        names = [name] if name else list(self.processes)
        for each in names:
            process = self.processes[each]
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for each in names:
            process = self.processes.pop(each)
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def deployment_for(settings: Settings) -> Deployment:
    """The deployment with every declared topic (and the app's output topics) created."""
    deployment = Deployment.from_settings(settings)
    ensure_topics(deployment, load_application(APP).output_topics)
    return deployment


def broker_pid() -> int | None:
    """The pid of the local broker (compose/local-kafka), to notice a restart mid-run.

    The broker on this machine is shared: another engineer's fault tests restart it,
    and a figure measured across a restart is not a figure. None if not known.
    """
    try:
        status = subprocess.run(
            [str(REPO / "compose" / "local-kafka"), "status"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    words = status.replace("(", " ").replace(")", " ").split()
    return int(words[words.index("pid") + 1]) if "pid" in words else None


def summary_head(bench: str, broker: int | None, say: Callable[[str], None]) -> dict[str, Any]:
    """The first keys of a benchmark's JSON summary; warns if the broker restarted.

    ``broker`` is ``broker_pid()`` taken when the measurements began.
    """
    restarted = broker_pid() != broker
    if restarted:
        say("WARNING: the broker restarted during this run; its figures are not valid")
    return {
        "bench": bench,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": cpus(),
        "broker_restarted": restarted,
    }


def wait_for_broker(bootstrap: str, timeout_s: float = 180.0) -> Any:
    """The broker's metadata, once it answers (the shared broker may be restarting)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return admin.list_topics(timeout=10)
        except KafkaException:
            if time.monotonic() >= deadline:
                raise
            time.sleep(1.0)  # the broker is down or starting; there is no event to wait on


def delete_topics(bootstrap: str, prefix: str) -> list[str]:
    """Delete every topic whose name starts with ``prefix`` (this run's)."""
    names = [name for name in wait_for_broker(bootstrap).topics if name.startswith(prefix)]
    if names:
        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
        for future in admin.delete_topics(names, operation_timeout=30).values():
            with contextlib.suppress(Exception):
                future.result()
    return names


def committed_consumer(bootstrap: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-watch-{uuid.uuid4().hex}",  # never joined: assign only
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 5,
            "enable.partition.eof": False,
        }
    )


class OutcomeWatcher:
    """Consumes runs.results from offset 0 on a thread: run id -> (outcome, seen at ms).

    ``arrivals``, if given, also gets ``(outcome, seen at ms)`` of each run's first
    outcome, as it is seen (a closed loop submits the next run on it).
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        bind: Callable[[bytes | None], None] | None = None,
        arrivals: queue.SimpleQueue[tuple[RunOutcome, float]] | None = None,
    ) -> None:
        self._bind = bind  # makes the codec know a Confluent schema id (registry framing)
        self._arrivals = arrivals
        self._consumer = committed_consumer(bootstrap)
        self._consumer.assign([KafkaTopicPartition(topic, p, 0) for p in range(partitions)])
        self.outcomes: dict[str, tuple[RunOutcome, float]] = {}
        self._stop = threading.Event()
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        decode = codec().decode_as
        consumer = self._consumer
        while not self._stop.is_set():
            # Not consume(1000, 0.05): with fewer than 1000 messages it returns only
            # after the whole 50 ms, so an outcome was seen up to 50 ms late.
            messages = wait_for_first(consumer.consume, consumer.poll, 1000, 0.05)
            now = time.time() * 1000
            seen = {}
            for msg in messages:
                if msg.error() is None:
                    if self._bind is not None:
                        self._bind(msg.value())
                    outcome = decode(msg.value(), RunOutcome)
                    seen[outcome.run_id] = (outcome, now)
            if seen:
                with self._changed:
                    for run_id, item in seen.items():
                        if run_id not in self.outcomes:
                            self.outcomes[run_id] = item
                            if self._arrivals is not None:
                                self._arrivals.put(item)
                    self._changed.notify_all()
        self._consumer.close()

    def wait_for(
        self,
        run_ids: Iterable[str],
        timeout_s: float,
        alive: Callable[[], None] | None = None,
    ) -> float:
        """Block until every run in ``run_ids`` has an outcome; return when (perf_counter).

        ``alive`` is called about twice a second (``Fleet.check`` raises if a process died).
        """
        wanted = set(run_ids)
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not wanted <= self.outcomes.keys():
                left = deadline - time.monotonic()
                if left <= 0:
                    done = len(wanted & self.outcomes.keys())
                    raise TimeoutError(f"{done} of {len(wanted)} runs finished in {timeout_s}s")
                self._changed.wait(min(left, 0.5))
                if alive is not None:
                    alive()
        return time.perf_counter()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


def submit_orders(client: Client, first: int, count: int) -> dict[str, int]:
    """Submit orders ``first .. first + count - 1`` and flush; run id -> submitted_ms."""
    submitted = {}
    for index in range(first, first + count):
        command = new_submit("orders", order(index))
        submitted[command.run_id] = command.submitted_ms
        client.send(command)
    client.flush()
    return submitted


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    new = NewTopic(name, num_partitions=partitions, replication_factor=1)
    admin.create_topics([new])[name].result()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        topic = admin.list_topics(name, timeout=10).topics.get(name)
        ready = topic is not None and topic.error is None and len(topic.partitions) == partitions
        if ready and all(p.leader >= 0 for p in topic.partitions.values()):
            return
        time.sleep(0.05)  # waiting for metadata propagation; there is no event
    raise TimeoutError(f"topic {name} not ready")


def wait_until_stable(bootstrap: str, topic: str, partitions: int, timeout_s: float = 60.0) -> None:
    """Wait until read_committed readers see every record written to ``topic`` so far.

    ``commit_transaction`` returns before the commit markers are written, so a bare
    consume started right after a fill could stop at an end short of the last
    transaction (at smoke-test sizes it does). Polls the last stable offsets.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex}",  # never joined: watermarks only
            "isolation.level": "read_uncommitted",  # the high watermark, markers pending
        }
    )
    try:
        ends = {
            TopicPartition(topic, p): consumer.get_watermark_offsets(
                KafkaTopicPartition(topic, p), timeout=10, cached=False
            )[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()
    if not StableOffsets({"bootstrap.servers": bootstrap}).wait_past(ends, timeout_s):
        raise TimeoutError(f"{topic}: commit markers not visible after {timeout_s}s")


_WARM_UP = b"w"


def raw_round_trip(
    bootstrap: str,
    topic: str,
    records: int,
    *,
    value_size: int = 120,
    transactional: bool = True,
    txn_batch: int = 500,
    partitions: int = 4,
    rate: float | None = None,
) -> dict[str, Any]:
    """Produce ``records`` records through ``topic`` and consume them read_committed.

    With ``transactional``, a transactional producer (the processor's producer config)
    commits every ``txn_batch`` records, as the processor commits each input batch;
    otherwise a plain idempotent producer (a client's) produces them all (or ``rate``
    per second, open loop) and flushes once.
    Rate: records / (last record consumed - first produce). Latency: consume time
    minus the record's CreateTime (set by librdkafka when ``produce`` is called).
    """
    create_topic(bootstrap, topic, partitions)
    consumer = committed_consumer(bootstrap)
    consumer.assign([KafkaTopicPartition(topic, p, 0) for p in range(partitions)])
    latencies: list[float] = []
    done = threading.Event()
    last_seen = [0.0]

    def consume() -> None:
        count = 0
        while count < records:
            for msg in consumer.consume(10_000, 0.05):
                if msg.error() is not None or msg.value() == _WARM_UP:
                    continue
                now = time.time() * 1000
                latencies.append(now - msg.timestamp()[1])
                count += len(msg.value() or b"") > 0
            last_seen[0] = time.perf_counter()
        done.set()

    config = {"bootstrap.servers": bootstrap} | PRODUCER_CONFIG
    if transactional:
        config |= {"transactional.id": f"{topic}-txn", "transaction.timeout.ms": 60_000}
    producer = Producer(config)
    if transactional:
        producer.init_transactions()
    else:  # a producer's first delivery waits for its producer id: not part of a trip
        producer.produce(topic, _WARM_UP, b"warm-up")
        producer.flush()
    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    started = time.perf_counter()
    batch = txn_batch if transactional else 0
    _produce(producer, topic, records, b"v" * value_size, txn_batch=batch, rate=rate)
    producer.flush()
    produced = time.perf_counter() - started
    if not done.wait(120):
        raise TimeoutError(f"baseline: only {len(latencies)} of {records} records consumed")
    reader.join()
    consumer.close()
    seconds = last_seen[0] - started
    latencies.sort()
    return {
        "records": records,
        "offered_rate": rate,
        "transactional": transactional,
        "txn_batch": txn_batch if transactional else None,
        "value_bytes": value_size,
        "seconds": round(seconds, 3),
        "produce_seconds": round(produced, 3),
        "records_per_s": records / seconds,
        "p50_ms": percentile(latencies, 0.50),
        "p95_ms": percentile(latencies, 0.95),
        "p99_ms": percentile(latencies, 0.99),
    }


def _produce(
    producer: Producer,
    topic: str,
    records: int,
    value: bytes,
    *,
    txn_batch: int,
    rate: float | None,
) -> None:
    """Produce ``records`` records: in transactions of ``txn_batch`` (if > 0), else plain,
    at ``rate`` per second (open loop) if given."""
    step = txn_batch or records
    started = time.perf_counter()
    for first in range(0, records, step):
        if txn_batch:
            producer.begin_transaction()
        for index in range(first, min(records, first + step)):
            if rate is not None:
                delay = started + index / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)  # pacing the offered load
                producer.poll(0)
            while True:
                try:
                    producer.produce(topic, value, f"run-{index:08d}".encode())
                    break
                except BufferError:
                    producer.poll(0.01)
        if txn_batch:
            producer.commit_transaction()


def describe_baseline(base: dict[str, Any]) -> str:
    kind = f"transactions of {base['txn_batch']}" if base["transactional"] else "plain producer"
    if base.get("offered_rate"):
        kind += f", offered {base['offered_rate']:,.0f}/s"
    return (
        f"raw round trip ({kind}, {base['records']:,} x {base['value_bytes']} B): "
        f"{base['records_per_s']:,.0f} records/s, p50 {base['p50_ms']:.1f} ms, "
        f"p99 {base['p99_ms']:.1f} ms"
    )


@contextlib.contextmanager
def temporary_topics(bootstrap: str, prefix: str, keep: bool = False) -> Iterator[None]:
    """Delete this run's topics on the way out (unless ``keep``)."""
    try:
        yield
    finally:
        if not keep:
            delete_topics(bootstrap, prefix)


@dataclass
class Engine:
    """A running deployment: processor, worker and responder processes, a client, a watcher."""

    settings: Settings
    deployment: Deployment
    fleet: Fleet
    client: Client
    watcher: OutcomeWatcher
    next_order: int = 0

    def submit(self, count: int) -> dict[str, int]:
        submitted = submit_orders(self.client, self.next_order, count)
        self.next_order += count
        return submitted

    def warm_up(self, runs: int, timeout_s: float = 180.0) -> float:
        """Run ``runs`` runs end to end (group joins, first fetches); return the seconds."""
        started = time.perf_counter()
        submitted = self.submit(runs)
        return self.watcher.wait_for(submitted, timeout_s, self.fleet.check) - started


@contextlib.contextmanager
def engine(
    bootstrap: str,
    prefix: str,
    root: Path,
    *,
    responder: str = "process",
    workers: int = 1,
    registry: str | None = None,
    announce_interval_ms: int | None = None,
) -> Iterator[Engine]:
    """The demo app on Kafka as separate processes (see ``Fleet``), torn down on exit.

    ``responder="thread"`` runs the Responder on a thread of this process instead,
    ``responder="none"`` runs none (awaits stay suspended until someone completes them).
    ``registry``: a Schema Registry URL, for the Confluent wire format.
    ``announce_interval_ms``: the workers' announcement interval, and so the
    processor's warm-up, during which every pipeline version counts as loaded.
    """
    settings = bench_settings(bootstrap, prefix, root / "data", registry)
    deployment = deployment_for(settings)
    env = process_env(settings)
    if announce_interval_ms is not None:
        env["PROCESSOR_WORKER_ANNOUNCE_INTERVAL_MS"] = str(announce_interval_ms)
    fleet = Fleet(root / "logs")
    stop = threading.Event()
    responding: threading.Thread | None = None
    ids = getattr(deployment.transport, "ids", None)  # a RegistryTransport's SchemaIds
    watcher = OutcomeWatcher(
        bootstrap,
        deployment.topology.name(TopicName.OUTCOMES),
        deployment.topology.partitions,
        None if ids is None else ids.bind,
    )
    client = Client(deployment.transport, deployment.topology, settings.state_dir)
    try:
        fleet.start("processor", processor_argv(settings), env)
        for index in range(workers):
            fleet.start(f"worker{index}", worker_argv(settings), env)
        if responder == "process":
            fleet.start("responder", responder_argv(settings), env)
        elif responder == "thread":
            from processor.clients.external import Responder
            from processor.examples.demo import payments_simulator

            answering = Responder(
                deployment.transport,
                deployment.topology,
                {"payments": payments_simulator},
                group=f"{prefix.rstrip('.')}-responders",
            )
            responding = threading.Thread(target=answering.run, args=(stop,), daemon=True)
            responding.start()
        yield Engine(settings, deployment, fleet, client, watcher)
    finally:
        stop.set()
        fleet.stop()
        if responding is not None:
            responding.join(10)
        client.close()
        watcher.close()


def measure_runs(
    running: Engine, runs: int, timeout_s: float, rate: float | None = None
) -> dict[str, Any]:
    """Submit ``runs`` runs (all at once, or ``rate`` per second) and wait for every outcome.

    runs/s = runs / (first submit -> last outcome visible). Latency per run:
    ``finished_ms - submitted_ms`` of its RunOutcome (the processor's clock at the
    outcome minus the client's at submit; one machine), and the time the outcome
    became visible to a read_committed consumer minus submitted_ms.
    """
    cpu_before = running.fleet.cpu()
    started = time.perf_counter()
    if rate is None:
        submitted = running.submit(runs)
    else:
        submitted = {}
        for index in range(runs):
            delay = started + index / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)  # pacing the offered load
            submitted |= _submit_one(running)
        running.client.flush()
    submit_seconds = time.perf_counter() - started
    finished = running.watcher.wait_for(submitted, timeout_s, running.fleet.check)
    seconds = finished - started
    cpu_after = running.fleet.cpu()
    seen = [running.watcher.outcomes[run_id] for run_id in submitted]
    latencies = sorted(o.finished_ms - o.submitted_ms for o, _ in seen)
    visible = sorted(at - o.submitted_ms for o, at in seen)
    cpu = {name: cpu_after[name] - cpu_before.get(name, 0.0) for name in cpu_after}
    return {
        "runs": runs,
        "offered_rate": rate,
        "succeeded": sum(o.status == "succeeded" for o, _ in seen),
        "failed": sum(o.status != "succeeded" for o, _ in seen),
        "seconds": round(seconds, 3),
        "submit_seconds": round(submit_seconds, 3),
        "runs_per_s": runs / seconds,
        "p50_ms": percentile(latencies, 0.50),
        "p95_ms": percentile(latencies, 0.95),
        "p99_ms": percentile(latencies, 0.99),
        "visible_p50_ms": percentile(visible, 0.50),
        "visible_p99_ms": percentile(visible, 0.99),
        "cpu_ms_per_run": {name: round(1000 * s / runs, 3) for name, s in cpu.items()},
    }


def _submit_one(running: Engine) -> dict[str, int]:
    command = new_submit("orders", order(running.next_order))
    running.next_order += 1
    running.client.send(command)
    return {command.run_id: command.submitted_ms}
