"""Helpers of the tests that run whole processors on a real Kafka broker (no tests here).

Every test gets its own ``KafkaSpace`` on the shared broker: a unique topic
prefix, processor group, worker group and resume secret, so tests (and
developers) sharing the broker never see each other's records, and the topics
are deleted when the test ends.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from processor.clients.client import Client, new_submit
from processor.config.settings import Settings
from processor.engine.host import Host
from processor.errors import TransportError
from processor.facts.codec import codec, decode_fact
from processor.facts.models import FactHeader, RunFailed, RunOutcome, RunSucceeded
from processor.facts.topics import TopicName
from processor.transport.base import ProcessorSession, Reader, Record
from processor.transport.deployment import Deployment, ensure_topics
from processor.transport.topology import Topology
from tests.apps.pipelines import app, expected_steps3_result
from tests.apps.support import (
    REPO_ROOT,
    ProcessorProcess,
    TopicTail,
    read_topic,
    transport_settings,
    wait_until,
)
from tests.kafka_broker import kafka_bootstrap, unavailable_reason

__all__ = [
    "FactsWatch",
    "KafkaProcessorProcess",
    "KafkaSpace",
    "assert_exactly_once",
    "assert_replay_verifies",
    "assert_steps3_once",
    "owned_partitions",
    "read_facts",
    "read_outcomes",
    "shared_by",
    "submit_steps3",
]

#: The broker refuses session timeouts below group.min.session.timeout.ms (6 s by default).
SESSION_TIMEOUT_MS = 6_000
#: Longer than any restore these tests do inside a rebalance callback.
MAX_POLL_INTERVAL_MS = 30_000
#: A killed processor's open transaction holds back read_committed readers of every
#: partition it wrote to until the broker aborts it (up to 10 s after this timeout).
TRANSACTION_TIMEOUT_MS = 10_000


@dataclass(frozen=True)
class KafkaSpace:
    """One test's private names on a shared broker, and how processes reach them."""

    bootstrap: str
    tag: str
    partitions: int = 4
    session_timeout_ms: int = SESSION_TIMEOUT_MS
    max_poll_interval_ms: int = MAX_POLL_INTERVAL_MS
    transaction_timeout_ms: int = TRANSACTION_TIMEOUT_MS
    schema_registry_url: str | None = None  # set: the Confluent wire format

    @staticmethod
    def new(bootstrap: str, partitions: int = 4) -> KafkaSpace:
        return KafkaSpace(bootstrap, f"kt{uuid.uuid4().hex[:12]}", partitions)

    @property
    def prefix(self) -> str:
        return f"{self.tag}."

    @property
    def group(self) -> str:
        return f"{self.tag}-processors"

    @property
    def worker_group(self) -> str:
        return f"{self.tag}-workers"

    @property
    def secret(self) -> str:
        return f"{self.tag}-resume-secret"

    def env(self, data_dir: Path) -> dict[str, str]:
        """The environment of a ``processor`` subprocess working in this space."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PROCESSOR_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        env.update({f"PROCESSOR_{k.upper()}": str(v) for k, v in self._fields(data_dir).items()})
        env["PROCESSOR_HTTP_PORT"] = "0"  # processors side by side: each on a free port
        return env

    def settings(self, data_dir: Path) -> Settings:
        """The settings of an in-process deployment in this space."""
        return Settings(**self._fields(data_dir))

    def deployment(self, data_dir: Path) -> Deployment:
        """An in-process deployment in this space, its topics created (those of ``app`` too)."""
        deployment = Deployment.from_settings(self.settings(data_dir))
        ensure_topics(deployment, app.output_topics)
        return deployment

    def _fields(self, data_dir: Path) -> dict[str, Any]:
        return {
            "broker": f"kafka://{self.bootstrap}",
            "topic_prefix": self.prefix,
            "group": self.group,
            "worker_group": self.worker_group,
            "resume_secret": self.secret,
            "data_dir": data_dir,
            "partitions": self.partitions,
            "kafka_session_timeout_ms": self.session_timeout_ms,
            "kafka_max_poll_interval_ms": self.max_poll_interval_ms,
            "kafka_transaction_timeout_ms": self.transaction_timeout_ms,
        } | ({"schema_registry_url": self.schema_registry_url} if self.schema_registry_url else {})

    def cli(
        self, data_dir: Path, *args: str, timeout_s: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``python -m processor ARGS`` against this space to completion."""
        return subprocess.run(
            [sys.executable, "-m", "processor", *args],
            cwd=REPO_ROOT,
            env=self.env(data_dir),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    def process(self, data_dir: Path, log_path: Path, *, workers: int = 2) -> KafkaProcessorProcess:
        return KafkaProcessorProcess(self, data_dir, log_path, workers=workers)

    def delete_topics(self) -> None:
        """Delete this space's topics and groups (best effort: the broker may be gone)."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        try:
            names = [n for n in admin.list_topics(timeout=10).topics if n.startswith(self.prefix)]
            if names:  # confluent-kafka refuses an empty list
                for future in admin.delete_topics(names, operation_timeout=30).values():
                    future.result()
            groups = [self.group, self.worker_group, f"{self.group}.triggers"]
            for future in admin.delete_consumer_groups(groups, request_timeout=10).values():
                future.result()
        except KafkaException:
            pass  # a group with members left, or a slow broker: the names are unique anyway


class KafkaProcessorProcess(ProcessorProcess):
    """``python -m processor --verbose run`` (or ``worker``) in a ``KafkaSpace``, at INFO."""

    def __init__(
        self,
        space: KafkaSpace,
        data_dir: Path,
        log_path: Path,
        *,
        workers: int = 2,
        command: str = "run",
    ):
        super().__init__(data_dir, log_path, workers=workers, command=command)
        self.space = space

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "processor", "--verbose", *self.command_args()]

    def env(self) -> dict[str, str]:
        return self.space.env(self.data_dir)

    def pause(self) -> None:
        """SIGSTOP: the whole process freezes, heartbeat threads included."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def owned(self) -> set[int]:
        """The run partitions this start of the process owns now, from its log."""
        return owned_partitions(self.log_text(), self.space.prefix + TopicName.COMMANDS)


def space_settings(
    kind: str, data: Path, partitions: int = 2
) -> tuple[Settings, KafkaSpace | None]:
    """Settings of a deployment under ``data`` on ``kind`` (``embedded`` or ``kafka``); on
    Kafka in a space of its own (delete its topics after), skipped with no broker."""
    if kind == "embedded":
        return transport_settings("embedded", data), None
    bootstrap = kafka_bootstrap()
    if bootstrap is None:
        pytest.skip(unavailable_reason())
    space = KafkaSpace.new(bootstrap, partitions=partitions)
    return space.settings(data / "data"), space


@contextmanager
def hosted(
    kind: str, data: Path, host_of: Callable[[Deployment], Host], **settings: Any
) -> Iterator[tuple[Host, Client]]:
    """A started host (``host_of`` the deployment on ``kind`` under ``data``, with
    ``settings`` changed) and a client; stopped after, with no error, its topics gone."""
    made, space = space_settings(kind, data)
    deployment = Deployment.from_settings(made.model_copy(update=settings))
    host = host_of(deployment)
    host.start()
    client = Client(deployment.transport, deployment.topology, deployment.settings.state_dir)
    try:
        yield host, client
    finally:
        client.close()
        host.stop()
        if space is not None:
            space.delete_topics()
    assert not host.errors, host.errors


def shared_by(first: KafkaProcessorProcess, second: KafkaProcessorProcess, partitions: int) -> bool:
    """Both own some partitions, none twice, and together all of them."""
    first.check_alive()
    second.check_alive()
    mine, theirs = first.owned(), second.owned()
    return bool(mine and theirs) and not mine & theirs and mine | theirs == set(range(partitions))


_OWNERSHIP = re.compile(r": (assigned|revoked|lost|revoked \(fenced\)) (.*)$")


def owned_partitions(log: str, topic: str) -> set[int]:
    """Replay a processor log's "assigned"/"revoked"/"lost" lines for ``topic``."""
    owned: set[int] = set()
    partition = re.compile(re.escape(topic) + r"\[(\d+)\]")
    for line in log.splitlines():
        if "kafka_session" not in line:
            continue
        found = _OWNERSHIP.search(line)
        if found is None:
            continue
        numbers = {int(p) for p in partition.findall(found.group(2))}
        if found.group(1) == "assigned":
            owned |= numbers
        else:
            owned -= numbers
    return owned


# --- the journal ----------------------------------------------------------------------------


class FactsWatch:
    """Follows runs.facts and remembers which runs have ended (succeeded or failed)."""

    def __init__(self, reader: Reader, topology: Topology) -> None:
        self._tail = TopicTail(reader, topology.name(TopicName.FACTS), topology.partitions)
        self.ended: dict[str, str] = {}

    def refresh(self) -> dict[str, str]:
        for record in self._tail.new():
            fact = decode_fact(record.value)
            if isinstance(fact, RunSucceeded | RunFailed):
                self.ended[fact.run_id] = type(fact).__name__
        return self.ended

    def committed(self) -> int:
        """How many facts were ever committed (all partitions)."""
        return self._tail.end_total()

    def all_ended(self, run_ids: Iterable[str]) -> bool:
        ended = self.refresh()
        return all(run_id in ended for run_id in run_ids)


def wait_all_ended(
    watch: FactsWatch, run_ids: Iterable[str], processor: ProcessorProcess, timeout_s: float
) -> None:
    """Wait for every run to end while the processor lives; on a stall, say what it did.

    The test's own reader may lose the broker for a while (an outage the test caused):
    that is not a stall, only a round that cannot look.
    """
    wanted = list(run_ids)

    def all_ended() -> bool:
        processor.check_alive()
        try:
            return watch.all_ended(wanted)
        except TransportError:
            return False

    try:
        wait_until(all_ended, timeout_s, "every run to end", max_pause_s=0.2)
    except AssertionError as stalled:
        open_runs = sum(1 for run_id in wanted if run_id not in watch.ended)
        tail = processor.log_text()[-8000:]
        message = f"{stalled}; {open_runs} runs open; processor log:\n{tail}"
        raise AssertionError(message) from stalled


def read_facts(reader: Reader, topology: Topology) -> list[FactHeader]:
    topic = topology.name(TopicName.FACTS)
    return [decode_fact(r.value) for r in read_topic(reader, topic, topology.partitions)]


def read_outcomes(reader: Reader, topology: Topology) -> list[RunOutcome]:
    topic = topology.name(TopicName.OUTCOMES)
    records = read_topic(reader, topic, topology.partitions)
    return [codec().decode_as(r.value, RunOutcome) for r in records]


def assert_exactly_once(
    facts: list[FactHeader],
    expected: Mapping[str, Any],
    *,
    result: Callable[[Any], Any] = lambda value: value,
) -> None:
    """Each run of ``expected`` (run id -> input) succeeded once, with ``result(input)``.

    No other run has facts, no (run id, fact key) appears twice, every run's
    sequence numbers are 1..n without gaps, and RunSucceeded is its last fact.
    """
    by_run: dict[str, list[FactHeader]] = defaultdict(list)
    for fact in facts:
        by_run[fact.run_id].append(fact)
    assert by_run.keys() == expected.keys(), "facts of unknown runs, or runs without facts"

    keys = Counter((f.run_id, f.fact_key) for f in facts)
    duplicated = [key for key, count in keys.items() if count > 1]
    assert duplicated == [], f"fact keys appended twice: {duplicated[:5]}"

    for run_id, run in by_run.items():
        assert [f.seq for f in run] == list(range(1, len(run) + 1)), run_id
        succeeded = [f for f in run if isinstance(f, RunSucceeded)]
        assert len(succeeded) == 1, (run_id, [type(f).__name__ for f in run])
        assert not any(isinstance(f, RunFailed) for f in run), run_id
        assert run[-1] is succeeded[0], run_id
        assert json.loads(succeeded[0].result) == result(expected[run_id]), run_id


def assert_outcomes_once(outcomes: list[RunOutcome], run_ids: Iterable[str]) -> None:
    """runs.results holds exactly one "succeeded" outcome per run."""
    assert Counter(o.run_id for o in outcomes) == Counter(dict.fromkeys(run_ids, 1))
    assert {o.status for o in outcomes} == {"succeeded"}


def submit_steps3(
    client: Client,
    inputs: dict[str, int],
    count: int,
    accept: Callable[[str], bool] = lambda run_id: True,
) -> list[str]:
    """Send ``count`` ``steps3`` runs (of run ids ``accept`` takes), numbered on from
    ``len(inputs)`` and recorded in ``inputs``; flush; return their run ids."""
    run_ids: list[str] = []
    while len(run_ids) < count:
        command = new_submit("steps3", {"n": len(inputs)})
        if not accept(command.run_id):
            continue
        inputs[command.run_id] = len(inputs)
        run_ids.append(command.run_id)
        client.send(command)
    client.flush()
    return run_ids


def assert_steps3_once(
    reader: Reader, topology: Topology, inputs: Mapping[str, Any]
) -> list[FactHeader]:
    """Every ``steps3`` run of ``inputs`` succeeded exactly once, in the journal and in
    runs.results (``assert_exactly_once``, ``assert_outcomes_once``); closes ``reader``.

    Returns the journal's facts.
    """
    try:
        facts = read_facts(reader, topology)
        outcomes = read_outcomes(reader, topology)
    finally:
        reader.close()
    assert_exactly_once(facts, inputs, result=expected_steps3_result)
    assert_outcomes_once(outcomes, inputs)
    return facts


def assert_replay_verifies(space: KafkaSpace, data_dir: Path, *options: str) -> dict[str, Any]:
    """``processor replay --verify [OPTIONS]`` on ``data_dir`` passes; return its report."""
    verify = space.cli(data_dir, "replay", "--verify", "--json", *options)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    report: dict[str, Any] = json.loads(verify.stdout)
    assert report["verified"] is True, report["differences"]
    assert report["differences"] == []
    return report


def poll_records(session: ProcessorSession, count: int) -> list[Record]:
    """What ``session`` polls until it has ``count`` records (a minute at most)."""
    records: list[Record] = []

    def enough() -> bool:
        records.extend(session.poll(100, 0.1))
        return len(records) >= count

    wait_until(enough, 60, f"{count} records")
    return records
