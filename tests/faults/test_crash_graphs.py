"""kill -9 a real ``processor run`` again and again while graph runs are in flight.

The workload is ``tests.apps.graph_pipelines``'s ``mixed`` pipeline on the embedded
log: two parallel branches (each sleeping a few milliseconds, one of them caught by a
handler when the input says ``break``), a switch after both that routes to one of two
steps by the input, a ``none_failed`` join after the routes, and a finally step. The
processor (with its in-process workers) is killed at moments chosen by a seeded RNG
(after a random amount of committed progress, or as soon as it reports running) and
restarted each time. At the end, from the journal: every run succeeded exactly once
with the result its input implies; no step's result was admitted twice (one
``NodeReady``, ``NodeSettled`` and ``StepCompleted`` per step that ran); the route not
taken never ran and was skipped once; each caught run decided its catch once; no fact
key repeats; sequence numbers are gapless; and ``replay --verify`` agrees with the live
projections.
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from processor.clients.client import Client, new_submit
from processor.config.settings import Settings
from processor.facts.codec import codec, decode_fact
from processor.facts.models import (
    CatchDecided,
    FactHeader,
    NodeReady,
    NodeSettled,
    NodeSkipped,
    RouteDecided,
    RunFailed,
    RunOutcome,
    RunStopped,
    RunSucceeded,
    StepCompleted,
)
from processor.facts.topics import TopicName
from processor.transport.deployment import Deployment, ensure_topics
from tests.apps.graph_pipelines import expected_mixed_result, mixed
from tests.apps.support import ProcessorProcess, TopicTail, cli, read_topic, wait_until

pytestmark = pytest.mark.slow

SEED = 20_251_205
RUNS = 300
KILLS = 5
TERMINAL = (RunSucceeded, RunFailed, RunStopped)
STEPS = [step.spec.name for step in mixed.steps]


@pytest.fixture
def processor_process(tmp_path: Path) -> Iterator[ProcessorProcess]:
    app = "tests.apps.graph_pipelines:app"
    process = ProcessorProcess(tmp_path / "data", tmp_path / "processor.log", app=app)
    try:
        yield process
    finally:
        process.close()


def test_kill_9_during_graph_runs_admits_each_step_once(
    processor_process: ProcessorProcess,
) -> None:
    data_dir = processor_process.data_dir
    deployment = Deployment.from_settings(Settings(data_dir=data_dir))
    ensure_topics(deployment)
    topology = deployment.topology
    client = Client(deployment.transport, topology, deployment.settings.state_dir)
    reader = deployment.transport.reader()
    facts_tail = TopicTail(reader, topology.name(TopicName.FACTS), topology.partitions)
    rng = random.Random(SEED)
    inputs: dict[str, dict[str, Any]] = {}
    ended: set[str] = set()

    def submit(count: int) -> None:
        for _ in range(count):
            value = {
                "n": len(inputs),
                "break": rng.random() < 0.3,
                "nap_ms": rng.choice([0, 5, 20]),
            }
            command = new_submit("mixed", value)
            inputs[command.run_id] = value
            client.send(command)
        client.flush()

    def progressed(target: int) -> bool:
        processor_process.check_alive()
        return facts_tail.end_total() >= target

    def all_ended() -> bool:
        processor_process.check_alive()
        for record in facts_tail.new():
            fact = decode_fact(record.value)
            if isinstance(fact, TERMINAL):
                ended.add(fact.run_id)
        return ended >= inputs.keys()

    try:
        processor_process.start()
        chunks = _chunks(RUNS, KILLS + 1)
        at_start = {rng.randrange(KILLS)}
        kills: list[tuple[str, int]] = []  # (when, runs in flight at the kill)
        for round_, chunk in enumerate(chunks[:-1]):
            submit(chunk)
            if round_ in at_start:
                processor_process.wait_running()  # often while it restores its stores
                when = "at start"
            else:
                # A graph run commits about 40 facts, in many small commits (one per
                # step result): a target within the chunk's first half leaves runs in
                # flight.
                target = facts_tail.end_total() + rng.randint(1, chunk * 20)
                wait_until(lambda t=target: progressed(t), 90, f"{target} facts", max_pause_s=0.01)
                when = f"at {target} facts"
            all_ended()
            kills.append((when, len(inputs) - len(ended)))
            assert processor_process.kill() == -9
            processor_process.start()
        submit(chunks[-1])
        assert all(in_flight > 0 for when, in_flight in kills if when != "at start"), kills

        wait_until(all_ended, 180, "every submitted run to end", max_pause_s=0.2)
        assert processor_process.stop() == 0
    finally:
        client.close()

    facts = [
        decode_fact(r.value)
        for r in read_topic(reader, topology.name(TopicName.FACTS), topology.partitions)
    ]
    outcomes = [
        codec().decode_as(r.value, RunOutcome)
        for r in read_topic(reader, topology.name(TopicName.OUTCOMES), topology.partitions)
    ]
    reader.close()
    _assert_each_run_once(facts, inputs)
    assert Counter(o.run_id for o in outcomes) == Counter(dict.fromkeys(inputs, 1))
    assert {o.status for o in outcomes} == {"succeeded"}

    verify = cli(data_dir, "replay", "--verify", "--json")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    report = json.loads(verify.stdout)
    assert report["verified"] is True, report["differences"]
    assert (report["facts"], report["runs"]) == (len(facts), len(inputs))


def _chunks(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _assert_each_run_once(facts: list[FactHeader], inputs: dict[str, dict[str, Any]]) -> None:
    by_run: dict[str, list[FactHeader]] = defaultdict(list)
    for fact in facts:
        by_run[fact.run_id].append(fact)
    assert by_run.keys() == inputs.keys(), "facts of unknown runs, or runs without facts"
    keys = Counter((f.run_id, f.fact_key) for f in facts)
    assert [key for key, count in keys.items() if count > 1] == [], "fact keys appended twice"
    for run_id, run in by_run.items():
        _assert_run(run_id, run, inputs[run_id])


def _assert_run(run_id: str, run: list[FactHeader], value: dict[str, Any]) -> None:
    assert [f.seq for f in run] == list(range(1, len(run) + 1)), run_id
    terminal = [f for f in run if isinstance(f, TERMINAL)]
    assert len(terminal) == 1 and terminal[0] is run[-1], (run_id, terminal)
    assert isinstance(terminal[0], RunSucceeded), (run_id, terminal[0])
    assert json.loads(terminal[0].result) == expected_mixed_result(value), run_id

    def steps(kind: type[Any]) -> Counter[str]:
        return Counter(STEPS[f.step] for f in run if isinstance(f, kind))

    taken = "even" if value["n"] * 2 % 4 == 0 else "odd"
    not_taken = "odd" if taken == "even" else "even"
    ran = {"start", "left", "right", "pick", taken, "merge", "tidy"}
    ran |= {"patch"} if value["break"] else set()
    once = Counter(dict.fromkeys(ran, 1))
    assert steps(NodeReady) == once, (run_id, steps(NodeReady))
    assert steps(NodeSettled) == once, (run_id, steps(NodeSettled))
    completed = once - Counter({"right": 1}) if value["break"] else once
    assert steps(StepCompleted) == completed, (run_id, steps(StepCompleted))
    skipped = [(STEPS[f.step], f.reason) for f in run if isinstance(f, NodeSkipped)]
    expected_skips = [(not_taken, "predicate_false")]
    if not value["break"]:
        expected_skips.insert(0, ("patch", "readiness_unsatisfied"))
    assert sorted(skipped) == sorted(expected_skips), (run_id, skipped)
    assert [f.routes for f in run if isinstance(f, RouteDecided)] == [(taken,)], run_id
    caught = [(STEPS[f.step], STEPS[f.handler]) for f in run if isinstance(f, CatchDecided)]
    assert caught == ([("right", "patch")] if value["break"] else []), run_id
