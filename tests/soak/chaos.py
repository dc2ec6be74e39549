"""The chaos soak: a mixed workload on the three-broker cluster while processes and
brokers are killed, paused and restarted at random moments (issue 30, item 3).

Run the long form from the repository root (it starts ``compose/local-kafka
cluster`` when ``--bootstrap`` is not given):

    .venv/bin/python -m tests.soak.chaos --minutes 30 --seed 1 [--rate 8] [--json]

``tests/soak/test_chaos_soak.py`` runs the short form in CI.

The deployment, in one ``KafkaSpace`` on the cluster (replication 3,
``min.insync.replicas`` 2): two ``processor run`` instances sharing the partitions
(``--workers 0``), two ``processor worker`` processes, and the responder (the demo's
payment system, ``bench/kafka_responder.py``). The app is ``tests.soak.soak_app``.
The second processor runs the quick segments itself (``PROCESSOR_INLINE_STEPS``,
issue 31) and writes a run's facts of a transaction as one record
(``PROCESSOR_FACT_BATCHES``): as partitions move between the two, a run's segments go
one way or the other, each partition's journal mixes single facts and batches, and the
verdict counts the attempts that ran in a processor and the batches written.

This process submits runs at ``--rate`` runs/s, a seeded mix: ``orders`` (the standard
workload; some with a deadline of a second or two), ``fanned`` (a fan-out under a
limit with a tolerated failure), ``branchy`` (branches, a caught failure, a route,
compensations, a finally step), ``mend`` (fails until its gate file exists: once it
failed, the soak opens its gate and redrives it), ``waiter`` (emits an event, then
waits for an event by correlation key, which the soak sends 1, 3 and 7 s after the
submit under one event id: the ones before the wait registered are refused) and
``parent`` (three child runs, two at a time). An interval schedule starts a
``ticker`` run every 2 s (catch-up: all). It cancels some runs soon after submitting
them. Meanwhile, one fault at a time: kill -9 a processor, SIGSTOP it for a
few seconds, kill -9 a worker or the responder, or kill -9 a broker (every other time
the leader of most ``runs.facts`` partitions); each is restarted after a short pause.

At the end, with every process back: each acknowledged submit, child run and
scheduled run reached exactly one terminal fact and one ``runs.results`` outcome per
generation (two for a redriven run), no fact key appears twice in ``runs.facts`` and
each run's sequence numbers are gapless, no event was admitted twice to a run, no
parent has more than its children, each emitted event id is on the emit topic once
(read committed), the schedule has one run per fire time with no fire time missing,
and ``replay --verify`` passes on both processors' stores. The report counts
runs, outcomes, faults by kind, lost (0), duplicated (0) and the longest stall (the
longest time without a new outcome while runs were open).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from processor.clients.client import Client, new_submit
from processor.config.settings import default_of
from processor.errors import TransportError
from processor.facts.codec import codec
from processor.facts.fact_batch import is_batch
from processor.facts.models import (
    BoundaryCompletionAdmitted,
    CancelRun,
    ChildRunLinked,
    EventEmitted,
    FactHeader,
    RedriveRun,
    RunFailed,
    RunOutcome,
    RunRedriven,
    RunStopped,
    RunSubmitted,
    RunSucceeded,
    SegmentAttemptStarted,
    WorkItem,
)
from processor.facts.topics import TopicName
from processor.transport.base import Reader, TopicPartition
from processor.transport.fact_batches import FactBatchReader
from processor.transport.topology import Topology
from tests.apps.support import REPO_ROOT, read_topic, wait_until
from tests.cluster.conftest import Cluster, start_cluster
from tests.kafka.support import KafkaProcessorProcess, KafkaSpace, read_facts
from tests.soak.soak_app import KIDS

APP = "tests.soak.soak_app:app"
PARTITIONS = 6
TERMINAL = (RunSucceeded, RunFailed, RunStopped)
#: The workload's mix: pipeline (with a deadline for "orders!") and its weight.
MIX = {
    "orders": 40,
    "orders!": 5,
    "fanned": 12,
    "branchy": 15,
    "mend": 10,
    "waiter": 10,
    "parent": 8,
}
#: Seconds after a waiter's submit at which its event is sent (one event id).
SIGNAL_AFTER_S = (1.0, 3.0, 7.0)
SCHEDULE = "soak-ticker"
SCHEDULE_INTERVAL_S = 2.0
#: Runs the soak does not submit itself: children and scheduled runs.
STARTED_BY_THE_PROCESSOR = ("kid", "ticker")
CANCEL_SHARE = 0.05
#: The verdict's counts that a passing soak has at 0.
MUST_BE_ZERO = (
    "lost",
    "duplicated",
    "duplicated_fact_keys",
    "sequence_gaps",
    "unknown_runs",
    "events_admitted_twice",
    "parents_with_too_many_children",
    "emitted_not_published_once",
    "fire_times_missing",
)
FAULTS = ("processor_kill", "processor_pause", "worker_kill", "responder_kill", "broker_kill")


@dataclass
class Tally:
    """What the soak did and saw; the report is made of it."""

    submitted: Counter[str] = field(default_factory=Counter)
    cancels: int = 0
    redrives: int = 0
    signals: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    longest_stall_s: float = 0.0


class Responder:
    """The demo's payment system (``bench/kafka_responder.py``) as a child process."""

    def __init__(self, space: KafkaSpace, data_dir: Path, log_path: Path) -> None:
        self._space, self._data_dir, self._log_path = space, data_dir, log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [
            sys.executable,
            str(REPO_ROOT / "bench" / "kafka_responder.py"),
            *("--broker", f"kafka://{self._space.bootstrap}"),
            *("--topic-prefix", self._space.prefix),
            *("--group", f"{self._space.tag}-responders"),
        ]
        with self._log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                argv,
                cwd=REPO_ROOT,
                env=self._space.env(self._data_dir),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(30)
        self.proc = None

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None


@dataclass
class Fleet:
    """The deployment's processes."""

    processors: list[KafkaProcessorProcess]
    workers: list[KafkaProcessorProcess]
    responder: Responder

    def start(self) -> None:
        for process in [*self.processors, *self.workers]:
            process.start()
        self.responder.start()

    def check_alive(self) -> None:
        for process in [*self.processors, *self.workers]:
            if process.proc is not None:
                process.check_alive()

    def close(self) -> None:
        for process in [*self.processors, *self.workers]:
            process.close()
        self.responder.close()


class Faults(threading.Thread):
    """One fault at a time, at seeded random moments, until ``stop`` is set."""

    def __init__(self, fleet: Fleet, cluster: Cluster, facts_topic: str, rng: random.Random):
        super().__init__(name="chaos-faults", daemon=True)
        self._fleet, self._cluster, self._facts_topic, self._rng = fleet, cluster, facts_topic, rng
        # A cluster that is not the launcher's keeps its brokers: they are not ours to kill.
        self._kinds = FAULTS if cluster.managed else FAULTS[:-1]
        self.stop = threading.Event()
        self.done: Counter[str] = Counter()
        self.error: BaseException | None = None
        self._broker_kills = 0

    def run(self) -> None:
        try:
            while not self.stop.wait(self._rng.uniform(3.0, 9.0)):
                kind = self._rng.choice(self._kinds)
                getattr(self, f"_{kind}")()
                self.done[kind] += 1
        except BaseException as exc:  # reported by the soak, which then fails
            self.error = exc

    def _pause(self, low: float, high: float) -> None:
        self.stop.wait(self._rng.uniform(low, high))

    def _processor_kill(self) -> None:
        victim = self._rng.choice(self._fleet.processors)
        victim.kill()
        self._pause(0.5, 3.0)
        victim.start()

    def _processor_pause(self) -> None:
        victim = self._rng.choice(self._fleet.processors)
        victim.pause()
        time.sleep(self._rng.uniform(2.0, 9.0))  # past the session timeout, sometimes
        victim.resume()

    def _worker_kill(self) -> None:
        victim = self._rng.choice(self._fleet.workers)
        victim.kill()
        self._pause(0.5, 3.0)
        victim.start()

    def _responder_kill(self) -> None:
        self._fleet.responder.kill()
        self._pause(0.5, 5.0)
        self._fleet.responder.start()

    def _broker_kill(self) -> None:
        self._broker_kills += 1
        if self._broker_kills % 2:
            leaders = list(self._cluster.leaders(self._facts_topic).values())
            node = max(set(leaders), key=leaders.count)
        else:
            node = self._rng.choice([1, 2, 3])
        self._cluster.kill(node)
        time.sleep(self._rng.uniform(3.0, 10.0))
        self._cluster.start_node(node)


class Outcomes:
    """``runs.results`` as it grows: outcomes per run, and the longest stall."""

    def __init__(self, reader: Reader, topology: Topology) -> None:
        name = topology.name(TopicName.OUTCOMES)
        self._reader = reader
        self._positions = {TopicPartition(name, p): 0 for p in range(topology.partitions)}
        self.by_run: dict[str, list[RunOutcome]] = defaultdict(list)
        self._last_new = time.monotonic()
        self.longest_stall_s = 0.0

    def refresh(self, open_runs: int) -> list[RunOutcome]:
        new: list[RunOutcome] = []
        try:
            for tp, position in self._positions.items():
                for batch in self._reader.read(tp, position):
                    new.extend(codec().decode_as(r.value, RunOutcome) for r in batch)
                    self._positions[tp] = batch[-1].offset + 1
        except TransportError:  # this process's own reader, while a broker is down:
            pass  # what it read is kept; the rest is read next time
        now = time.monotonic()
        if new or not open_runs:
            self._last_new = now
        self.longest_stall_s = max(self.longest_stall_s, now - self._last_new)
        for outcome in new:
            self.by_run[outcome.run_id].append(outcome)
        return new


class Workload:
    """Submits the mix, cancels some runs, redrives the failed ``mend`` runs."""

    def __init__(self, client: Client, gates: Path, rng: random.Random) -> None:
        self._client, self._gates, self._rng = client, gates, rng
        self.pipelines: dict[str, str] = {}  # run id -> pipeline
        self.gates: dict[str, Path] = {}  # run id -> gate file, of the mend runs
        self.redriven: set[str] = set()
        self.tally = Tally()
        self._to_cancel: list[tuple[float, str]] = []
        self._to_signal: list[tuple[float, str]] = []  # (when, order number)

    def submit(self, count: int) -> None:
        kinds, weights = zip(*MIX.items(), strict=True)
        for kind in self._rng.choices(kinds, weights, k=count):
            n = len(self.pipelines)
            pipeline = kind.rstrip("!")
            value: dict[str, Any] = {"n": n}
            deadline_ms = None
            if pipeline == "orders":
                value = {"order_id": f"o-{n}", "amount": 10 + n % 90}
            if kind == "orders!":
                deadline_ms = int(time.time() * 1000) + self._rng.randint(500, 2_500)
            if pipeline == "mend":
                value["gate"] = str(self._gates / f"gate-{n}")
            if pipeline == "waiter":
                value["order"] = f"k-{n}"
                now = time.monotonic()
                self._to_signal.extend((now + after, value["order"]) for after in SIGNAL_AFTER_S)
            command = new_submit(pipeline, value, deadline_ms=deadline_ms)
            if pipeline == "mend":
                self.gates[command.run_id] = Path(value["gate"])
            self._client.send(command)
            self.pipelines[command.run_id] = pipeline
            self.tally.submitted[kind] += 1
            if self._rng.random() < CANCEL_SHARE:
                self._to_cancel.append((time.monotonic() + self._rng.uniform(0, 2), command.run_id))
        self._client.flush()  # acknowledged from here on

    def cancel_due(self) -> None:
        now = time.monotonic()
        due = [run_id for when, run_id in self._to_cancel if when <= now]
        self._to_cancel = [(when, run_id) for when, run_id in self._to_cancel if when > now]
        for run_id in due:
            self._client.send(
                CancelRun(command_id=str(uuid.uuid4()), run_id=run_id, requested_ms=_now_ms())
            )
            self.tally.cancels += 1
        if due:
            self._client.flush()

    def signal_due(self) -> None:
        """Send the due ``paid`` events by correlation key, each order's under one id."""
        now = time.monotonic()
        due = [order for when, order in self._to_signal if when <= now]
        self._to_signal = [(when, order) for when, order in self._to_signal if when > now]
        for order in due:
            self._client.signal("paid", {"order": order}, key=order, event_id=f"paid-{order}")
            self.tally.signals += 1
        if due:
            self._client.flush()

    def redrive_failed(self, new: list[RunOutcome]) -> None:
        failed = [
            o.run_id
            for o in new
            if o.pipeline == "mend" and o.status == "failed" and o.run_id not in self.redriven
        ]
        for run_id in failed:
            self.gates[run_id].touch()  # the redriven attempt finds its gate open
            self._client.send(
                RedriveRun(command_id=str(uuid.uuid4()), run_id=run_id, requested_ms=_now_ms())
            )
            self.redriven.add(run_id)
            self.tally.redrives += 1
        if failed:
            self._client.flush()


def _now_ms() -> int:
    return int(time.time() * 1000)


def started_by_the_processor(facts: list[FactHeader]) -> dict[str, str]:
    """Run id -> pipeline of the child and scheduled runs in ``facts``."""
    return {
        f.run_id: f.pipeline
        for f in facts
        if isinstance(f, RunSubmitted) and f.pipeline in STARTED_BY_THE_PROCESSOR
    }


def check(
    runs: dict[str, str],
    facts: list[FactHeader],
    outcomes: dict[str, list[RunOutcome]],
    emitted_ids: Counter[str],
) -> dict[str, Any]:
    """The end state's verdict over ``runs`` (run id -> pipeline): lost and duplicated
    runs, facts, outcomes, admitted events, children, emitted events and fire times."""
    by_run: dict[str, list[FactHeader]] = defaultdict(list)
    for fact in facts:
        by_run[fact.run_id].append(fact)
    keys = Counter((f.run_id, f.fact_key) for f in facts)
    duplicated_keys = [key for key, count in keys.items() if count > 1]
    lost: list[str] = []
    duplicated: list[str] = []
    gaps: list[str] = []
    statuses: Counter[str] = Counter()
    for run_id, pipeline in runs.items():
        run = by_run.get(run_id, [])
        if [f.seq for f in run] != list(range(1, len(run) + 1)):
            gaps.append(run_id)
        generations = 1 + sum(isinstance(f, RunRedriven) for f in run)
        terminal = sum(isinstance(f, TERMINAL) for f in run)
        published = outcomes.get(run_id, [])
        if terminal < generations or len(published) < generations:
            lost.append(run_id)
        elif terminal > generations or len(published) > generations:
            duplicated.append(run_id)
        for outcome in published[-1:]:
            statuses[f"{pipeline}:{outcome.status}"] += 1
    events = Counter(
        (f.run_id, f.idempotency_key)
        for f in facts
        if isinstance(f, BoundaryCompletionAdmitted) and f.source == "event"
    )
    children = Counter(f.parent_run_id for f in facts if isinstance(f, ChildRunLinked))
    emitted = Counter(f.event_id for f in facts if isinstance(f, EventEmitted))
    fires = sorted(int(r.rsplit("@", 1)[1]) for r, p in runs.items() if p == "ticker")
    interval_ms = int(SCHEDULE_INTERVAL_S * 1000)
    missing = sum((b - a) // interval_ms - 1 for a, b in itertools.pairwise(fires))
    return {
        "runs": len(runs),
        "facts": len(facts),
        "outcomes": dict(sorted(statuses.items())),
        "lost": len(lost),
        "duplicated": len(duplicated),
        "duplicated_fact_keys": len(duplicated_keys),
        "sequence_gaps": len(gaps),
        "unknown_runs": len(set(by_run) - set(runs)),
        "events_admitted": sum(events.values()),
        "events_admitted_twice": sum(1 for count in events.values() if count > 1),
        "children": sum(children.values()),
        "parents_with_too_many_children": sum(1 for n in children.values() if n > KIDS),
        "emitted": len(emitted),
        "emitted_not_published_once": sum(1 for eid in emitted if emitted_ids.get(eid, 0) != 1)
        + len(set(emitted_ids) - set(emitted)),
        "scheduled_runs": len(fires),
        "fire_times_missing": missing,
        "examples": {
            "lost": [_story(r, runs, by_run) for r in lost[:5]],
            "duplicated": [_story(r, runs, by_run) for r in duplicated[:5]],
            "gaps": [_story(r, runs, by_run) for r in gaps[:5]],
            "duplicated_fact_keys": [
                _story(r, runs, by_run) for r in dict.fromkeys(r for r, _ in duplicated_keys[:5])
            ],
        },
    }


def _story(run_id: str, runs: dict[str, str], by_run: dict[str, list[FactHeader]]) -> str:
    """One run's facts in one line, for a failing verdict's examples."""
    facts = " ".join(f"{f.seq}:{type(f).__name__}:{f.fact_key}" for f in by_run.get(run_id, []))
    return f"{runs.get(run_id, '?')} {run_id}: {facts}"


def attempts_run_inline(reader: Reader, topology: Topology, facts: list[FactHeader]) -> int:
    """Forward attempts started with no work item on segments.work (read committed):
    the ones a processor ran itself (every other is dispatched with its start)."""
    dispatched = {
        (item.run_id, item.segment, item.attempt, item.generation)
        for record in read_topic(reader, topology.name(TopicName.WORK), topology.partitions)
        if isinstance(item := codec().decode(record.value), WorkItem) and item.kind == "forward"
    }
    started = {
        (f.run_id, f.segment, f.attempt, f.generation)
        for f in facts
        if isinstance(f, SegmentAttemptStarted)
    }
    return len(started - dispatched)


def fact_batches_written(reader: Reader, topology: Topology) -> int:
    """The records of runs.facts that hold several facts (read as written)."""
    records = reader.inner if isinstance(reader, FactBatchReader) else reader
    return sum(
        is_batch(record.value)
        for record in read_topic(records, topology.name(TopicName.FACTS), topology.partitions)
    )


def emitted_event_ids(reader: Reader, topic: str, partitions: int) -> Counter[str]:
    """How many times each event id is on the emit topic, read committed."""
    return Counter(
        dict(record.headers)["event-id"].decode()
        for record in read_topic(reader, topic, partitions)
    )


def replay_verifies(space: KafkaSpace, data_dir: Path) -> dict[str, Any]:
    done = space.cli(data_dir, "replay", "--verify", "--json", timeout_s=600)
    try:  # a failed verify prints its report too: the differences are in it
        report: dict[str, Any] = json.loads(done.stdout)
    except ValueError:
        report = {}
    if done.returncode != 0:
        report["error"] = done.stderr[-2000:]
    return report


def emit_topic(space: KafkaSpace) -> str:
    """The topic ``waiter`` emits to: one of the space's, deleted with it."""
    return f"{space.prefix}emitted"


@contextmanager
def deployed(cluster: Cluster, root: Path) -> Iterator[tuple[KafkaSpace, Fleet]]:
    space = replace(
        KafkaSpace.new(cluster.bootstrap, partitions=PARTITIONS),
        transaction_timeout_ms=default_of("kafka_transaction_timeout_ms"),
    )
    processors = [
        KafkaProcessorProcess(space, root / f"p{i}", root / f"processor{i}.log", workers=0)
        for i in range(2)
    ]
    workers = [
        KafkaProcessorProcess(
            space, root / f"w{i}", root / f"worker{i}.log", workers=1, command="worker"
        )
        for i in range(2)
    ]
    for process in [*processors, *workers]:
        process.app = APP
        process.extra_env = {"SOAK_EMIT_TOPIC": emit_topic(space)}
    processors[1].extra_env |= {"PROCESSOR_INLINE_STEPS": "true", "PROCESSOR_FACT_BATCHES": "true"}
    fleet = Fleet(processors, workers, Responder(space, root / "r", root / "responder.log"))
    try:
        yield space, fleet
    finally:
        fleet.close()
        space.delete_topics()


def soak(cluster: Cluster, root: Path, minutes: float, seed: int, rate: float) -> dict[str, Any]:
    """Run the soak for ``minutes`` and return its report (``report["passed"]``)."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    gates = root / "gates"
    gates.mkdir(exist_ok=True)
    cluster.wait_all_brokers()
    with deployed(cluster, root) as (space, fleet):
        deployment = space.deployment(root / "client")
        topology = deployment.topology
        client = Client(deployment.transport, topology, deployment.settings.state_dir)
        reader = deployment.transport.reader()
        outcomes = Outcomes(reader, topology)
        workload = Workload(client, gates, rng)
        faults = Faults(fleet, cluster, topology.name(TopicName.FACTS), random.Random(seed + 1))
        fleet.start()
        for process in fleet.processors:
            process.wait_running(120)
        schedules = client.schedules
        created = schedules.create(
            SCHEDULE,
            "ticker",
            {"tick": True},
            interval_s=SCHEDULE_INTERVAL_S,
            catch_up="all",
            catch_up_limit=1_000,
        )
        assert created.changed, created
        started = time.monotonic()
        faults.start()
        try:
            owed = 0.0
            while time.monotonic() - started < minutes * 60:
                owed += rate * 0.2
                if int(owed):
                    workload.submit(int(owed))
                    owed -= int(owed)
                workload.cancel_due()
                workload.signal_due()
                open_runs = len(workload.pipelines) - len(outcomes.by_run)
                workload.redrive_failed(outcomes.refresh(open_runs))
                if faults.error is not None:
                    raise faults.error
                time.sleep(0.2)
        finally:
            faults.stop.set()
            faults.join(120)
        if faults.error is not None:
            raise faults.error
        soak_s = time.monotonic() - started
        wait_until(lambda: schedules.pause(SCHEDULE).changed, 120, "the schedule to pause")

        def settled() -> bool:
            fleet.check_alive()
            pending = [
                r
                for r in workload.pipelines
                if not outcomes.by_run.get(r)
                or (r in workload.redriven and len(outcomes.by_run[r]) < 2)
            ]
            workload.redrive_failed(outcomes.refresh(len(pending)))
            return not pending

        wait_until(settled, 300, "every run to end", max_pause_s=0.5)
        runs: dict[str, str] = {}

        def all_ended() -> bool:
            """Every run ended, the children and scheduled runs too (read afresh: one
            may have started since the last look)."""
            facts = read_facts(reader, topology)
            runs.update(started_by_the_processor(facts), **workload.pipelines)
            outcomes.refresh(1)
            return all(outcomes.by_run.get(run_id) for run_id in runs)

        wait_until(all_ended, 120, "the child and scheduled runs to end", max_pause_s=1.0)
        client.close()
        facts = read_facts(reader, topology)
        outcomes.refresh(0)
        emitted = emitted_event_ids(reader, emit_topic(space), topology.partitions)
        run_inline = attempts_run_inline(reader, topology, facts)
        batches = fact_batches_written(reader, topology)
        reader.close()
        verdict = check(runs, facts, outcomes.by_run, emitted)
        replays = [replay_verifies(space, p.data_dir) for p in fleet.processors]
        report = {
            "seed": seed,
            "minutes": minutes,
            "soak_s": round(soak_s, 1),
            "submitted": dict(workload.tally.submitted),
            "cancels_sent": workload.tally.cancels,
            "redrives_sent": workload.tally.redrives,
            "signals_sent": workload.tally.signals,
            "faults": dict(faults.done),
            "longest_stall_s": round(outcomes.longest_stall_s, 1),
            **verdict,
            "attempts_run_inline": run_inline,
            "fact_batches": batches,
            "replay_verified": [r.get("verified") is True for r in replays],
            "replay_failures": [
                json.dumps(r)[:3000] for r in replays if r.get("verified") is not True
            ],
        }
        report["passed"] = all(verdict[name] == 0 for name in MUST_BE_ZERO) and all(
            report["replay_verified"]
        )
        return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=float, default=8.0, help="runs submitted per second")
    parser.add_argument("--bootstrap", help="a running cluster's host:port,... (no broker kills)")
    parser.add_argument("--dir", type=Path, help="where the processes keep state and logs")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cluster = Cluster(args.bootstrap, managed=False) if args.bootstrap else start_cluster()
    root = args.dir or Path(f"/tmp/chaos-soak-{uuid.uuid4().hex[:6]}")
    report = soak(cluster, root, args.minutes, args.seed, args.rate)
    print(json.dumps(report) if args.json else json.dumps(report, indent=2))
    sys.exit(0 if report["passed"] else 1)


if __name__ == "__main__":
    main()
