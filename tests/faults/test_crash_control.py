"""kill -9 a real ``processor run`` again and again while runs are cancelled, time out and unwind.

The workload (``tests.apps.control_pipelines``), shuffled by a seeded RNG:

- ``ok``: booking runs that succeed;
- ``reject``: booking runs whose last step refuses, so they fail and compensate
  (``charge`` then ``reserve``; ``notify`` has no compensator and is skipped);
- ``cancel``: approval runs cancelled once they wait at their await (compensated);
- ``deadline``: timed runs whose pipeline deadline expires while they wait;
- ``race``: booking runs cancelled right after they are submitted, racing their
  first attempt (cancelled and compensated, or succeeded if the cancel came late).

The processor is killed at moments chosen by the RNG (after a random amount of
committed progress, or as soon as it reports running) and restarted each time.
Work claimed by the workers of a killed process is redelivered to them when the
process is back; an attempt whose timer ran out meanwhile comes back as a forward
attempt would, except a compensator a worker had reported started: it becomes
Unknown, and the test plays the operator, resolving it with an explicit retry.
At the end every run has exactly one terminal record with the (execution,
recovery) pair its story implies, no fact key repeats, sequence numbers are
gapless, and ``replay --verify`` agrees with the live projections.
"""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter, defaultdict
from typing import Any

import pytest

from processor.clients.client import Client, new_submit
from processor.facts.codec import codec, decode_fact
from processor.facts.models import (
    AttemptOutcomeUnknown,
    AttemptResolved,
    BoundaryCompletionAdmitted,
    CancelRun,
    CompensationStepCompleted,
    CompensationStepSkipped,
    FactHeader,
    ResolveAttempt,
    RunFailed,
    RunOutcome,
    RunStopped,
    RunStopRequested,
    RunSucceeded,
    SegmentSuspended,
    StepCompleted,
)
from processor.facts.topics import TopicName
from processor.transport.deployment import Deployment, ensure_topics
from tests.apps.control_pipelines import expected_booking_result
from tests.apps.support import ProcessorProcess, TopicTail, read_topic, wait_until
from tests.faults.crash_env import CrashEnv

pytestmark = pytest.mark.slow

SEED = 20_250_612
KILLS = 6
WORKLOAD = {"ok": 220, "reject": 40, "cancel": 40, "deadline": 30, "race": 30}
TERMINAL = (RunSucceeded, RunFailed, RunStopped)


class Workload:
    """Submits and cancels runs, and follows runs.facts to know what happened."""

    def __init__(self, deployment: Deployment, process: ProcessorProcess) -> None:
        topology = deployment.topology
        self.process = process
        self.client = Client(deployment.transport, topology, deployment.settings.state_dir)
        self.reader = deployment.transport.reader()
        self.facts_topic = topology.name(TopicName.FACTS)
        self.partitions = topology.partitions
        self.facts = TopicTail(self.reader, self.facts_topic, self.partitions)
        self.kind: dict[str, str] = {}
        self.inputs: dict[str, dict[str, Any]] = {}
        self.ended: set[str] = set()
        self.cancelled: set[str] = set()
        self.resolved = 0  # compensator attempts an operator had to retry

    def close(self) -> None:
        self.client.close()
        self.reader.close()

    def submit(self, kinds: list[str]) -> None:
        for kind in kinds:
            n = len(self.kind)
            pipeline, value = {
                "ok": ("booking", {"id": n, "amount": n}),
                "reject": ("booking", {"id": n, "reject": True}),
                "cancel": ("approval", {"n": n}),
                "deadline": ("timed", {"id": n}),
                "race": ("booking", {"id": n, "amount": n}),
            }[kind]
            command = new_submit(pipeline, value)
            self.kind[command.run_id] = kind
            self.inputs[command.run_id] = value
            self.client.send(command)
            if kind == "race":  # right behind its submit, on the same partition
                self._cancel(command.run_id)
        self.client.flush()

    def _cancel(self, run_id: str) -> None:
        self.cancelled.add(run_id)
        self.client.send(
            CancelRun(
                command_id=str(uuid.uuid4()), run_id=run_id, reason="crash test", requested_ms=0
            )
        )

    def _retry_compensation(self, unknown: AttemptOutcomeUnknown) -> None:
        """Play the operator: a compensator attempt lost with a killed worker is retried."""
        self.resolved += 1
        self.client.send(
            ResolveAttempt(
                command_id=str(uuid.uuid4()),
                run_id=unknown.run_id,
                kind="compensate",
                segment=unknown.segment,
                attempt=unknown.attempt,
                generation=unknown.generation,
                idempotency_key=f"operator/{unknown.run_id}/{unknown.fact_key}",
                action="retry",
            )
        )

    def follow(self) -> None:
        """Read new facts: note ended runs, cancel runs that wait, resolve lost compensators."""
        self.process.check_alive()
        sent = False
        for record in self.facts.new():
            fact = decode_fact(record.value)
            if isinstance(fact, TERMINAL):
                self.ended.add(fact.run_id)
            elif (
                isinstance(fact, SegmentSuspended)
                and self.kind.get(fact.run_id) == "cancel"
                and fact.run_id not in self.cancelled
            ):
                self._cancel(fact.run_id)
                sent = True
            elif isinstance(fact, AttemptOutcomeUnknown):
                assert fact.kind == "compensate", f"no step of this workload is effectful: {fact}"
                self._retry_compensation(fact)
                sent = True
        if sent:
            self.client.flush()

    def progressed(self, target: int) -> bool:
        self.follow()
        return self.facts.end_total() >= target

    def stuck(self) -> list[tuple[str, str, list[str]]]:
        """The runs without a terminal record: kind, id and their last facts (diagnostics)."""
        missing = sorted(set(self.kind) - self.ended)
        journal: dict[str, list[str]] = defaultdict(list)
        for record in read_topic(self.reader, self.facts_topic, self.partitions):
            if record.key is not None and record.key.decode() in missing:
                journal[record.key.decode()].append(type(decode_fact(record.value)).__name__)
        return [(self.kind[r], r, journal[r][-6:]) for r in missing[:10]]

    def all_ended(self) -> bool:
        self.follow()
        return self.ended >= self.kind.keys()


def test_kill_9_during_cancels_deadlines_and_unwinds_keeps_every_run_exact(
    crash_env: CrashEnv,
) -> None:
    processor_process = crash_env.process
    deployment = crash_env.deployment
    ensure_topics(deployment)
    topology = deployment.topology
    rng = random.Random(SEED)
    kinds = [kind for kind, count in WORKLOAD.items() for _ in range(count)]
    rng.shuffle(kinds)
    work = Workload(deployment, processor_process)

    try:
        processor_process.start()
        chunks = _split(kinds, KILLS + 1)
        at_start = set(rng.sample(range(KILLS), 2))
        kills: list[tuple[str, int]] = []
        for round_, chunk in enumerate(chunks[:-1]):
            work.submit(chunk)
            if round_ in at_start:
                processor_process.wait_running()  # often while it restores its stores
                when = "at start"
            else:
                target = work.facts.end_total() + rng.randint(1, 600)
                wait_until(lambda t=target: work.progressed(t), 90, f"{target} facts", 0.01)
                when = f"at {target} facts"
            work.follow()
            kills.append((when, len(work.kind) - len(work.ended)))
            assert processor_process.kill() == -9
            processor_process.start()
        work.submit(chunks[-1])
        assert len(work.kind) >= 300
        assert all(in_flight > 0 for when, in_flight in kills if when != "at start"), kills

        try:
            wait_until(work.all_ended, 60, "every run to reach a terminal record", 0.1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; not ended: {work.stuck()}") from None
        assert processor_process.stop() == 0
    finally:
        work.close()

    reader = deployment.transport.reader()
    try:
        facts = [
            decode_fact(r.value)
            for r in read_topic(reader, topology.name(TopicName.FACTS), topology.partitions)
        ]
        outcomes = [
            codec().decode_as(r.value, RunOutcome)
            for r in read_topic(reader, topology.name(TopicName.OUTCOMES), topology.partitions)
        ]
    finally:
        reader.close()
    by_run = _journal_is_exact(facts, work.kind.keys())
    unknown = {
        (f.run_id, f.kind, f.segment, f.generation)
        for f in facts
        if isinstance(f, AttemptOutcomeUnknown)
    }
    settled = {
        (f.run_id, f.kind, f.segment, f.generation) for f in facts if isinstance(f, AttemptResolved)
    }
    assert unknown == settled, "every Unknown attempt was settled exactly by one resolution"
    stories = Counter(_check_story(work.kind[r], work.inputs[r], by_run[r]) for r in work.kind)
    assert stories["cancelled_waiting"] == WORKLOAD["cancel"], stories
    assert stories["failed_and_compensated"] == WORKLOAD["reject"], stories
    assert stories["cancelled_mid_flight"] > 0, stories  # a running attempt settled first
    assert stories["timed_out"] > 0, stories
    assert Counter(o.run_id for o in outcomes) == Counter(dict.fromkeys(work.kind, 1))

    verify = crash_env.cli("replay", "--verify", "--json")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    report = json.loads(verify.stdout)
    assert report["verified"] is True, report["differences"]
    assert (report["facts"], report["runs"]) == (len(facts), len(work.kind))


def _split(items: list[str], parts: int) -> list[list[str]]:
    size, extra = divmod(len(items), parts)
    chunks, start = [], 0
    for index in range(parts):
        end = start + size + (1 if index < extra else 0)
        chunks.append(items[start:end])
        start = end
    return chunks


def _journal_is_exact(facts: list[FactHeader], runs: Any) -> dict[str, list[FactHeader]]:
    by_run: dict[str, list[FactHeader]] = defaultdict(list)
    for fact in facts:
        by_run[fact.run_id].append(fact)
    assert by_run.keys() == set(runs), "facts of unknown runs, or runs without facts"
    repeated = [k for k, n in Counter((f.run_id, f.fact_key) for f in facts).items() if n > 1]
    assert repeated == [], f"fact keys appended twice: {repeated[:5]}"
    for run_id, run in by_run.items():
        assert [f.seq for f in run] == list(range(1, len(run) + 1)), run_id
        terminal = [f for f in run if isinstance(f, TERMINAL)]
        assert len(terminal) == 1 and run[-1] is terminal[0], (run_id, terminal)
        assert len([f for f in run if isinstance(f, RunStopRequested)]) <= 1, run_id
    return by_run


def _compensations(run: list[FactHeader]) -> tuple[list[int], list[int]]:
    done = [f.step for f in run if isinstance(f, CompensationStepCompleted)]
    skipped = [f.step for f in run if isinstance(f, CompensationStepSkipped)]
    return done, skipped


def _check_story(kind: str, value: dict[str, Any], run: list[FactHeader]) -> str:
    """Assert the terminal record this run's story implies; name the story.

    A kill may lose the attempt that was running when a run was stopped (the workers
    of the killed process take their claimed work with them): the attempt then times
    out, and the unwind holds only the steps that did complete.
    """
    terminal = run[-1]
    stops = [f.reason for f in run if isinstance(f, RunStopRequested)]
    completed = [f.step for f in run if isinstance(f, StepCompleted)]
    done, skipped = _compensations(run)
    where = f"{kind} run {terminal.run_id}: {[type(f).__name__ for f in run]}"
    if kind == "ok" or (kind == "race" and not stops):
        assert isinstance(terminal, RunSucceeded), where
        assert json.loads(terminal.result) == expected_booking_result(value), where
        assert (stops, done, skipped) == ([], [], []), where
        return "succeeded" if kind == "ok" else "race_lost_to_success"
    if kind == "reject":
        assert isinstance(terminal, RunFailed), where
        assert (terminal.step, terminal.recovery) == (3, "PartiallyCompensated"), where
        assert (stops, completed, done, skipped) == (["failed"], [0, 1, 2], [1, 0], [2]), where
        return "failed_and_compensated"
    assert isinstance(terminal, RunStopped), where
    if kind == "cancel":  # cancelled while waiting at its await
        assert (terminal.execution, terminal.recovery) == ("Cancelled", "Compensated"), where
        assert (stops, completed, done, skipped) == (["cancelled"], [0], [0], []), where
        assert not any(isinstance(f, BoundaryCompletionAdmitted) for f in run), where
        return "cancelled_waiting"
    if kind == "deadline":
        assert stops == ["timed_out"] and terminal.execution == "TimedOut", where
        if completed == [0]:  # hold completed, before or after the deadline: undone
            assert (terminal.recovery, done, skipped) == ("Compensated", [0], []), where
            return "timed_out"
        assert (completed, terminal.recovery, done) == ([], "NotRequired", []), where
        return "timed_out_attempt_lost"
    # A race the cancel won: the running attempt settled (all four steps, or none if it
    # was lost), then the unwind; notify and confirm have no compensator.
    assert stops == ["cancelled"] and terminal.execution == "Cancelled", where
    if completed:
        assert completed == [0, 1, 2, 3], where
        assert (terminal.recovery, done, skipped) == ("PartiallyCompensated", [1, 0], [3, 2])
        return "cancelled_mid_flight"
    assert (terminal.recovery, done, skipped) == ("NotRequired", [], []), where
    return "cancelled_attempt_lost"
