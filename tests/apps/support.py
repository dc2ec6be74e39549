"""Helpers for tests that run the processor: polling with deadlines, log tails,
``processor`` subprocesses and a processor loop driven by hand with a fake clock."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

import pytest

from processor.clients.client import new_submit
from processor.config.settings import Settings
from processor.engine.loop import LoopConfig, ProcessorLoop
from processor.facts.codec import codec, decode_fact, encode
from processor.facts.fact_batch import is_batch
from processor.facts.keyring import KeyRing
from processor.facts.models import (
    AttemptProgress,
    AvroModel,
    FactHeader,
    Rejected,
    StopNotice,
    WorkItem,
)
from processor.facts.topics import TopicName
from processor.model.state import RunState
from processor.transport.base import Headers, Outbound, Reader, Record, TopicPartition
from processor.transport.deployment import Deployment, ensure_topics
from processor.transport.fact_batches import FactBatchReader
from processor.transport.partitioner import partition_for
from processor.transport.topology import Topology
from processor.worker.executor import execute
from processor.worker.pipeline import Application

__all__ = [
    "REPO_ROOT",
    "FakeClock",
    "LoopHarness",
    "ProcessorProcess",
    "TopicTail",
    "assert_facts_batched",
    "cli",
    "decode_records",
    "read_topic",
    "run_facts",
    "subprocess_env",
    "transport_settings",
    "wait_until",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


def wait_until(
    condition: Callable[[], T], timeout_s: float, what: str, max_pause_s: float = 0.05
) -> T:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    pause = 0.002
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(pause)  # polling interval of a deadline-bounded wait, not a fixed delay
        pause = min(pause * 2, max_pause_s)


# --- reading topics -------------------------------------------------------------------------


def read_topic(reader: Reader, topic: str, partitions: int) -> Iterator[Record]:
    """Every committed record of ``topic``, partition by partition, in offset order."""
    for partition in range(partitions):
        for batch in reader.read(TopicPartition(topic, partition), 0):
            yield from batch


def assert_facts_batched(reader: Reader, topology: Topology) -> None:
    """That the journal holds its facts in fewer than half as many records, some of them
    fact batches (``PROCESSOR_FACT_BATCHES``)."""
    assert isinstance(reader, FactBatchReader)
    topic = topology.name(TopicName.FACTS)
    records = list(read_topic(reader.inner, topic, topology.partitions))
    facts = sum(1 for _ in read_topic(reader, topic, topology.partitions))
    assert any(is_batch(r.value) for r in records)
    assert 0 < len(records) * 2 < facts, (len(records), facts)


def decode_records(records: Iterator[Record] | list[Record], model: type[Any]) -> list[Any]:
    return [codec().decode_as(record.value, model) for record in records]


def run_facts(reader: Reader, deployment: Deployment, run_id: str) -> list[FactHeader]:
    """The facts of one run, read from its runs.facts partition in log order."""
    topology = deployment.topology
    tp = TopicPartition(
        topology.name(TopicName.FACTS), partition_for(run_id.encode(), topology.partitions)
    )
    facts = []
    for batch in reader.read(tp, 0):
        for record in batch:
            if record.key == run_id.encode():
                facts.append(decode_fact(record.value))
    return facts


class TopicTail:
    """Reads the records appended to every partition of one topic since the last call."""

    def __init__(self, reader: Reader, topic: str, partitions: int, *, from_end: bool = False):
        self._reader = reader
        self._tps = [TopicPartition(topic, p) for p in range(partitions)]
        self.positions = {tp: reader.end_offset(tp) if from_end else 0 for tp in self._tps}

    def new(self) -> list[Record]:
        found: list[Record] = []
        for tp in self._tps:
            for batch in self._reader.read(tp, self.positions[tp]):
                found.extend(batch)
                self.positions[tp] = batch[-1].offset + 1
        return found

    def end_total(self) -> int:
        """The sum of the end offsets of every partition (records ever committed)."""
        return sum(self._reader.end_offset(tp) for tp in self._tps)


class RejectedWatch:
    """Collects admission.rejected records and finds the one for a source record."""

    def __init__(self, reader: Reader, deployment: Deployment) -> None:
        topology = deployment.topology
        self._tail = TopicTail(reader, topology.name(TopicName.REJECTED), topology.partitions)
        self.seen: list[Rejected] = []

    def refresh(self) -> list[Rejected]:
        """Read the rejections committed since the last call into ``seen``."""
        self.seen.extend(decode_records(self._tail.new(), Rejected))
        return self.seen

    def find(self, source: Record) -> Rejected | None:
        self.refresh()
        for rejected in self.seen:
            if (
                rejected.source_topic,
                rejected.source_partition,
                rejected.source_offset,
            ) == (source.topic, source.partition, source.offset):
                return rejected
        return None


def find_produced(reader: Reader, tp: TopicPartition, start: int, value: bytes) -> Record | None:
    """The record of ``tp`` at or after ``start`` whose value is exactly ``value``."""
    for batch in reader.read(tp, start):
        for record in batch:
            if record.value == value:
                return record
    return None


# --- processes ------------------------------------------------------------------------------


def subprocess_env(data_dir: Path) -> dict[str, str]:
    """The environment of a ``processor`` subprocess: this checkout on the path, one data dir."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROCESSOR_")}
    paths = [str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PROCESSOR_DATA_DIR"] = str(data_dir)
    # Tests run processors side by side: each serves HTTP on a free port of its own.
    env["PROCESSOR_HTTP_PORT"] = "0"
    return env


def cli(data_dir: Path, *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run ``python -m processor --data-dir D ARGS`` to completion."""
    return subprocess.run(
        [sys.executable, "-m", "processor", "--data-dir", str(data_dir), *args],
        cwd=REPO_ROOT,
        env=subprocess_env(data_dir),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


#: What each command logs once it has started: ``run`` on stderr, ``worker`` on stdout.
_STARTED_LINES = {"run": " running (", "worker": "ready: "}
_SERVING = re.compile(r"http: serving on (http://\S+)")


class ProcessorProcess:
    """``python -m processor --data-dir D run --app APP`` as a child process, logs in a file.

    With ``command="worker"``: ``processor worker --app APP``, workers only.
    """

    def __init__(
        self,
        data_dir: Path,
        log_path: Path,
        *,
        app: str = "tests.apps.pipelines:app",
        workers: int = 2,
        command: str = "run",
    ) -> None:
        assert command in _STARTED_LINES, command
        self.data_dir = data_dir
        self.log_path = log_path
        self.app = app
        self.workers = workers
        self.command = command
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._log_start = 0
        self.starts = 0
        self.extra_env: dict[str, str] = {}  # on top of ``env()``, from the next start

    def start(self) -> None:
        assert self.proc is None, "already started"
        self._log = self.log_path.open("ab")
        self._log_start = self.log_path.stat().st_size
        self.proc = subprocess.Popen(
            self.argv(),
            cwd=REPO_ROOT,
            env={**self.env(), **self.extra_env},
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.starts += 1

    def argv(self) -> list[str]:
        """The command line of the next start."""
        return [
            *(sys.executable, "-m", "processor", "--data-dir", str(self.data_dir)),
            *self.command_args(),
        ]

    def command_args(self) -> list[str]:
        """``run`` (or ``worker``) and its options."""
        return [self.command, "--app", self.app, "--workers", str(self.workers)]

    def env(self) -> dict[str, str]:
        """The environment of the next start (without ``extra_env``)."""
        return subprocess_env(self.data_dir)

    def log_text(self) -> str:
        """What this start of the process has logged so far."""
        with self.log_path.open("rb") as f:
            f.seek(self._log_start)
            return f.read().decode(errors="replace")

    def check_alive(self) -> None:
        """Fail (showing the log) if the process has exited."""
        assert self.proc is not None, "not started"
        if self.proc.poll() is not None:
            code, log = self.proc.returncode, self.log_text()[-3000:]
            raise AssertionError(f"processor {self.command} exited with {code}:\n{log}")

    def running(self) -> bool:
        """Whether this start of the process has reported that it is running."""
        self.check_alive()
        return _STARTED_LINES[self.command] in self.log_text()

    def http_address(self) -> str | None:
        """The address this start of the process serves HTTP on, once it has said it."""
        self.check_alive()
        found = _SERVING.search(self.log_text())
        return found.group(1) if found else None

    def wait_running(self, timeout_s: float = 60.0) -> None:
        wait_until(self.running, timeout_s, f"the {self.command} process to report it is running")

    def kill(self, timeout_s: float = 30.0) -> int:
        """SIGKILL the process and reap it."""
        proc = self._take()
        proc.send_signal(signal.SIGKILL)
        return proc.wait(timeout_s)

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM the process and wait for it to exit; return its exit code."""
        proc = self._take()
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)
            raise

    def _take(self) -> subprocess.Popen[bytes]:
        proc, self.proc = self.proc, None
        assert proc is not None, "not started"
        if self._log is not None:
            self._log.close()
            self._log = None
        return proc

    def close(self) -> None:
        """Kill the process if it still runs (test teardown)."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.kill()
            else:
                self._take()


# --- a processor loop driven by hand --------------------------------------------------------


class FakeClock:
    """An injected clock in epoch milliseconds that only moves when told."""

    def __init__(self, now_ms: int = 1_800_000_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance_to(self, when_ms: int) -> None:
        assert when_ms >= self.now_ms, "time does not go back"
        self.now_ms = when_ms


class LoopHarness:
    """A ProcessorLoop on an embedded log with a fake clock and a manual worker.

    Nothing runs on its own: ``drive`` calls ``run_once`` until a condition
    holds, and ``work`` / ``complete`` play the worker's part.
    """

    def __init__(
        self,
        data_dir: Path,
        app: Application,
        clock: FakeClock | None = None,
        *,
        settings: Settings | None = None,
        secret: bytes = b"",
        keys: KeyRing | None = None,
        instance_id: str = "processor-1",
    ):
        settings = settings or Settings(data_dir=data_dir)
        self.keys = keys or KeyRing.single(secret)
        self.app = app
        self.deployment = Deployment.from_settings(settings)
        ensure_topics(self.deployment, app.output_topics)
        self.clock = clock or FakeClock()
        transport, topology = self.deployment.transport, self.deployment.topology
        # Scan timers whenever the fake clock moved, so due times are exact to the millisecond.
        config = dataclasses.replace(
            LoopConfig.from_settings(settings, instance_id=instance_id, resume_keys=self.keys),
            poll_timeout_s=0.005,
            timer_interval_ms=1,
        )
        self.loop = ProcessorLoop(transport, app, topology, config, clock=self.clock)
        self.loop.start()
        self.producer = transport.producer()
        self.reader = transport.reader()
        self._work = TopicTail(self.reader, topology.name(TopicName.WORK), topology.partitions)
        self._control = TopicTail(
            self.reader, topology.name(TopicName.CONTROL), topology.partitions
        )
        self.rejected = RejectedWatch(self.reader, self.deployment)
        self.work_items: list[WorkItem] = []
        self.stop_notices: list[StopNotice] = []

    @classmethod
    def for_settings(
        cls,
        settings: Settings,
        app: Application,
        *,
        secret: bytes = b"",
        keys: KeyRing | None = None,
    ) -> LoopHarness:
        """A harness on whatever transport ``settings`` name (embedded or Kafka)."""
        return cls(settings.data_dir, app, settings=settings, secret=secret, keys=keys)

    def loop_state(self, run_id: str) -> RunState | None:
        """The run's committed projection in the loop's own store."""
        return self.loop.run_state(run_id)

    def suspended(self, run_id: str) -> bool:
        state = self.loop_state(run_id)
        return state is not None and state.phase == "suspended"

    def name(self, topic: TopicName) -> str:
        return self.deployment.topology.name(topic)

    def submit(self, pipeline: str, value: Any, idempotency_key: str | None = None) -> str:
        command = new_submit(pipeline, value, idempotency_key)
        self.produce(TopicName.COMMANDS, command.run_id, encode(command))
        return command.run_id

    def produce(
        self,
        topic: TopicName,
        key: str,
        value: bytes,
        *,
        flush: bool = True,
        headers: Headers = (),
    ) -> Record:
        """Produce one record and return it as committed (with its offset).

        With ``flush=False`` the record is only buffered (call ``producer.flush()``
        later) and the returned record carries offset -1.
        """
        name = self.name(topic)
        partition = partition_for(key.encode(), self.deployment.topology.partitions)
        tp = TopicPartition(name, partition)
        record = Outbound(name, key.encode(), value, headers, partition)
        if not flush:
            self.producer.produce(record)
            return Record(name, partition, -1, key.encode(), value, headers)
        start = self.reader.end_offset(tp)
        self.producer.produce(record)
        self.producer.flush()
        record = find_produced(self.reader, tp, start, value)
        assert record is not None
        return record

    def produce_model(
        self, topic: TopicName, key: str, value: AvroModel, *, flush: bool = True
    ) -> Record:
        return self.produce(topic, key, encode(value), flush=flush)

    def drive(self, condition: Callable[[], T], what: str, max_rounds: int = 20_000) -> T:
        """Call ``run_once`` until ``condition`` holds (bounded by rounds and a deadline)."""
        deadline = time.monotonic() + 30.0
        for _ in range(max_rounds):
            self.loop.run_once()
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                break
        raise AssertionError(f"the loop never reached: {what}")

    def facts(self, run_id: str) -> list[FactHeader]:
        return run_facts(self.reader, self.deployment, run_id)

    def fact_types(self, run_id: str) -> list[str]:
        return [type(f).__name__ for f in self.facts(run_id)]

    def new_work(self) -> list[WorkItem]:
        """Work items dispatched since the last call (also kept in ``work_items``); the
        stop notices on segments.control are kept in ``stop_notices``."""
        items = []
        for record in self._work.new():
            message = codec().decode(record.value)
            assert isinstance(message, WorkItem), f"{message!r} on segments.work"
            items.append(message)
        for record in self._control.new():
            message = codec().decode(record.value)
            assert isinstance(message, StopNotice), f"{message!r} on segments.control"
            self.stop_notices.append(message)
        self.work_items.extend(items)
        return items

    def complete(self, item: WorkItem) -> Record:
        """Run the item's steps here, as a worker would, and produce the result."""
        result = execute(item, self.app, "test-worker")
        return self.produce_model(TopicName.RESULTS, item.run_id, result)

    def report(
        self, item: WorkItem, report: str = "started", *, step: int | None = None, worker: str = "w"
    ) -> Record:
        """Produce a worker's progress report on ``item`` (its first step by default)."""
        progress = AttemptProgress(
            run_id=item.run_id,
            kind=item.kind,
            segment=item.segment,
            attempt=item.attempt,
            generation=item.generation,
            step=item.first_step if step is None else step,
            report=report,  # type: ignore[arg-type]
            worker_id=worker,
            at_ms=self.clock(),
        )
        return self.produce_model(TopicName.RESULTS, item.run_id, progress)

    def started(self, item: WorkItem, *, step: int | None = None, worker: str = "w") -> int:
        """Report ``item``'s step started, drive until it is recorded; its new expiry."""
        self.report(item, step=step, worker=worker)
        first = item.first_step if step is None else step

        def recorded() -> int | None:
            state = self.loop_state(item.run_id)
            attempt = state.attempt if state is not None else None
            if attempt is None or (attempt.generation, attempt.started_step, attempt.worker_id) != (
                item.generation,
                first,
                worker,
            ):
                return None
            return attempt.expires_ms

        return int(self.drive(recorded, f"step {first} of {item.run_id} started"))

    def close(self) -> None:
        self.loop.close()
        self.producer.close()
        self.reader.close()


def transport_settings(kind: str, path: Path) -> Settings:
    """Settings of a deployment on the ``kind`` transport (``embedded`` or ``kafka``)
    under ``path``: on Kafka its own topics and group (skipped with no broker)."""
    if kind == "embedded":
        return Settings(data_dir=path / "data")
    from tests.kafka_broker import kafka_bootstrap, unavailable_reason

    bootstrap = kafka_bootstrap()
    if bootstrap is None:
        pytest.skip(unavailable_reason())
    return Settings(
        broker=f"kafka://{bootstrap}",
        data_dir=path / "data",
        topic_prefix=f"t{uuid.uuid4().hex[:10]}.",
        group=f"g{uuid.uuid4().hex[:10]}",
        partitions=2,
    )
