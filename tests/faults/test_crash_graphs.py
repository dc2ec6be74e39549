"""kill -9 a real ``processor run`` again and again while graph runs are in flight.

The workload, on the embedded log, is mostly ``tests.apps.graph_pipelines``'s ``mixed``
pipeline: two parallel branches (each sleeping a few milliseconds, one of them caught
by a handler when the input says ``break``), a switch after both that routes to one of
two steps by the input, a ``none_failed`` join after the routes, and a finally step.
Some runs are ``routes`` runs, whose switch chooses a route, the other, or one it did
not declare (then it fails, the run fails, and the join and the finally step still run);
some are ``fanned`` runs, a fan-out of 20 to 50 items (at most ``FAN_LIMIT`` in flight,
some items failing, ``FAN_TOLERATE`` tolerated: beyond that the run fails); and some are
``answered`` runs, whose await branch (beside a plain step) a ``Responder`` thread in
this process answers. The processor (with its in-process workers) is killed at moments
chosen by a seeded RNG (after a random amount of committed progress, or as soon as it
reports running) and restarted each time. At the end, from the journal: every run ended
exactly once, as its input implies, with its result; no step's result was admitted twice
(one ``NodeReady``, ``NodeSettled`` and ``StepCompleted`` per step that ran); a route
not taken never ran and was skipped once; each caught run decided its catch once; each
fan-out item started and settled at most once (every item, when the tolerance held),
never more than ``FAN_LIMIT`` open at once (counted from the facts); each await's
interaction was admitted exactly once; no fact key repeats; sequence numbers are
gapless; and ``replay --verify`` agrees with the live projections.
"""

from __future__ import annotations

import functools
import json
import random
import threading
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from processor.clients.client import Client, new_submit
from processor.clients.external import Responder
from processor.config.settings import Settings
from processor.facts.codec import codec, decode_fact
from processor.facts.models import (
    BoundaryCompletionAdmitted,
    BoundaryInteractionDispatched,
    BoundaryRequest,
    CatchDecided,
    FactHeader,
    FanOutItemSettled,
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
from tests.apps.graph_pipelines import (
    FAN_LIMIT,
    GRAPH_APPROVALS,
    answered,
    expected_answered_result,
    expected_fanned_result,
    expected_mixed_result,
    fanned,
    mixed,
    routes,
)
from tests.apps.support import ProcessorProcess, TopicTail, cli, read_topic, wait_until

pytestmark = pytest.mark.slow

SEED = 20_251_205
RUNS = 360
KILLS = 6
TERMINAL = (RunSucceeded, RunFailed, RunStopped)
PIPELINES = (mixed, routes, fanned, answered)
STEPS = {p.name: [step.spec.name for step in p.steps] for p in PIPELINES}
Submitted = tuple[str, dict[str, Any]]  # the pipeline and the input of a run


@pytest.fixture
def processor_process(tmp_path: Path) -> Iterator[ProcessorProcess]:
    app = "tests.apps.graph_pipelines:app"
    process = ProcessorProcess(tmp_path / "data", tmp_path / "processor.log", app=app)
    try:
        yield process
    finally:
        process.close()


def answer(request: BoundaryRequest, value: Any) -> dict[str, int]:
    """The external system's answer to an ``answered`` run's await."""
    return approval(value)


def approval(value: dict[str, Any]) -> dict[str, int]:
    """What the answer to an await requesting ``value`` is: a function of it, checkable."""
    return {"approved": int(value["n"]) * 3 + 1}


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
    inputs: dict[str, Submitted] = {}
    ended: set[str] = set()
    responder = Responder(
        deployment.transport, topology, {GRAPH_APPROVALS: answer}, group="graph-responder"
    )
    stop_responder = threading.Event()
    responder_thread = threading.Thread(target=responder.run, args=(stop_responder,), daemon=True)

    def submit(count: int) -> None:
        for _ in range(count):
            n = len(inputs)
            kind = rng.random()
            if kind < 0.15:
                choice = rng.choice(["refund", "reship", "lose"])
                run: Submitted = ("routes", {"choose": choice, "amount": n})
            elif kind < 0.25:
                size, bad = rng.randint(20, 50), rng.choice([0, 1, 3, 4, 6])
                bad_items = set(rng.sample(range(size), bad))
                items = [
                    {"i": i, "bad": i in bad_items, "nap_ms": rng.choice([0, 0, 5])}
                    for i in range(size)
                ]
                run = ("fanned", {"items": items})
            elif kind < 0.4:
                run = ("answered", {"n": n, "nap_ms": rng.choice([0, 5, 20])})
            else:
                breaks = rng.random() < 0.3
                run = ("mixed", {"n": n, "break": breaks, "nap_ms": rng.choice([0, 5, 20])})
            command = new_submit(*run)
            inputs[command.run_id] = run
            client.send(command)
        client.flush()

    def progressed(target: int) -> bool:
        processor_process.check_alive()
        return facts_tail.end_total() >= target

    mapping: set[str] = set()  # runs whose fan-out started items
    awaiting: set[str] = set()  # runs whose await asked, not yet answered

    def all_ended() -> bool:
        processor_process.check_alive()
        for record in facts_tail.new():
            fact = decode_fact(record.value)
            if isinstance(fact, TERMINAL):
                ended.add(fact.run_id)
            elif isinstance(fact, NodeReady) and fact.item is not None:
                mapping.add(fact.run_id)
            elif isinstance(fact, BoundaryInteractionDispatched):
                awaiting.add(fact.run_id)
            elif isinstance(fact, BoundaryCompletionAdmitted):
                awaiting.discard(fact.run_id)
        return ended >= inputs.keys()

    try:
        responder_thread.start()
        processor_process.start()
        chunks = _chunks(RUNS, KILLS + 1)
        at_start = {rng.randrange(KILLS)}
        # (when, runs in flight at the kill, of them fan-outs mapping, awaits asked)
        kills: list[tuple[str, int, int, int]] = []
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
                reached = functools.partial(progressed, target)
                wait_until(reached, 90, f"{target} facts", max_pause_s=0.01)
                when = f"at {target} facts"
            all_ended()
            in_flight = len(inputs) - len(ended)
            kills.append((when, in_flight, len(mapping - ended), len(awaiting - ended)))
            assert processor_process.kill() == -9
            processor_process.start()
        submit(chunks[-1])
        assert all(in_flight > 0 for when, in_flight, _, _ in kills if when != "at start"), kills
        # Some kill landed while a fan-out had items open or started, and one while an
        # await waited for its answer.
        assert any(fans for _, _, fans, _ in kills), kills
        assert any(asked for _, _, _, asked in kills), kills

        wait_until(all_ended, 180, "every submitted run to end", max_pause_s=0.2)
        assert processor_process.stop() == 0
    finally:
        stop_responder.set()
        responder_thread.join(30)
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
    failing = {run_id for run_id, run in inputs.items() if _story(*run).result is None}
    assert {o.run_id for o in outcomes if o.status == "failed"} == failing
    assert {o.status for o in outcomes if o.run_id not in failing} == {"succeeded"}
    kinds = Counter(pipeline for pipeline, _ in inputs.values())
    assert all(kinds[p.name] > 0 for p in PIPELINES), kinds
    assert any(inputs[r][0] == "fanned" for r in failing), "no fan-out beyond its tolerance"
    assert responder.answered >= kinds["answered"]

    verify = cli(data_dir, "replay", "--verify", "--json")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    report = json.loads(verify.stdout)
    assert report["verified"] is True, report["differences"]
    assert (report["facts"], report["runs"]) == (len(facts), len(inputs))


def _chunks(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _assert_each_run_once(facts: list[FactHeader], inputs: dict[str, Submitted]) -> None:
    by_run: dict[str, list[FactHeader]] = defaultdict(list)
    for fact in facts:
        by_run[fact.run_id].append(fact)
    assert by_run.keys() == inputs.keys(), "facts of unknown runs, or runs without facts"
    keys = Counter((f.run_id, f.fact_key) for f in facts)
    assert [key for key, count in keys.items() if count > 1] == [], "fact keys appended twice"
    for run_id, run in by_run.items():
        assert [f.seq for f in run] == list(range(1, len(run) + 1)), run_id
        terminal = [f for f in run if isinstance(f, TERMINAL)]
        assert len(terminal) == 1 and terminal[0] is run[-1], (run_id, terminal)
        pipeline, value = inputs[run_id]
        _assert_story(run_id, run, STEPS[pipeline], _story(pipeline, value))
        if pipeline == "fanned":
            _assert_items_once(run_id, run, value)
        admitted = [f for f in run if isinstance(f, BoundaryCompletionAdmitted)]
        assert len(admitted) == (1 if pipeline == "answered" else 0), (run_id, admitted)


def _assert_items_once(run_id: str, run: list[FactHeader], value: dict[str, Any]) -> None:
    """Each item started and settled once, lowest index first, never more than
    ``FAN_LIMIT`` open at once; every item when the tolerance held."""
    size = len(value["items"])
    started = [f.item for f in run if isinstance(f, NodeReady) and f.item is not None]
    settled = Counter(f.item for f in run if isinstance(f, FanOutItemSettled))
    assert started == list(range(len(started))), (run_id, started)
    assert settled == Counter(started), (run_id, settled)
    if expected_fanned_result(value) is not None:
        assert len(started) == size, (run_id, len(started), size)
    open_items, most = 0, 0
    for fact in run:
        if isinstance(fact, NodeReady) and fact.item is not None:
            open_items += 1
            most = max(most, open_items)
        elif isinstance(fact, FanOutItemSettled):
            open_items -= 1
    assert most == min(FAN_LIMIT, size), (run_id, most)


@dataclass(frozen=True)
class Story:
    """What a run's journal must show, from its input."""

    result: Any  # None: the run fails
    ran: set[str]
    failed: set[str]  # of ``ran``: settled failed, no StepCompleted
    skipped: list[tuple[str, str]]
    routes: list[tuple[str, ...]]
    caught: list[tuple[str, str]]


def _story(pipeline: str, value: dict[str, Any]) -> Story:
    stories = {
        "mixed": _mixed_story,
        "routes": _routes_story,
        "fanned": _fanned_story,
        "answered": _answered_story,
    }
    return stories[pipeline](value)


def _fanned_story(value: dict[str, Any]) -> Story:
    result = expected_fanned_result(value)
    if result is None:  # beyond the tolerance: the fan-out fails, count never runs
        skipped = [("count", "readiness_unsatisfied")]
        return Story(None, {"listing", "each"}, {"each"}, skipped, [], [])
    return Story(result, {"listing", "each", "count"}, set(), [], [], [])


def _answered_story(value: dict[str, Any]) -> Story:
    result = expected_answered_result(value, approval(value))
    ran = {"ask", "approve", "compute", "conclude", "wrap"}
    return Story(result, ran, set(), [], [], [])


def _mixed_story(value: dict[str, Any]) -> Story:
    taken = "even" if value["n"] * 2 % 4 == 0 else "odd"
    not_taken = "odd" if taken == "even" else "even"
    ran = {"start", "left", "right", "pick", taken, "merge", "tidy"}
    skipped = [(not_taken, "predicate_false")]
    if value["break"]:
        return Story(
            expected_mixed_result(value),
            ran | {"patch"},
            {"right"},
            skipped,
            [(taken,)],
            [("right", "patch")],
        )
    skipped.append(("patch", "readiness_unsatisfied"))
    return Story(expected_mixed_result(value), ran, set(), skipped, [(taken,)], [])


def _routes_story(value: dict[str, Any]) -> Story:
    choice = value["choose"]
    if choice == "lose":  # the switch fails; close (none_failed) and audit still run
        skipped = [("refund", "readiness_unsatisfied"), ("reship", "readiness_unsatisfied")]
        return Story(None, {"triage", "close", "audit"}, {"triage"}, skipped, [], [])
    other = "reship" if choice == "refund" else "refund"
    done = {"refund": "refunded", "reship": "reshipped"}[choice]
    result = {choice: {done: value["amount"]}, other: None}
    ran = {"triage", choice, "close", "audit"}
    return Story(result, ran, set(), [(other, "predicate_false")], [(choice,)], [])


def _assert_story(run_id: str, run: list[FactHeader], steps: list[str], story: Story) -> None:
    if story.result is None:
        assert isinstance(run[-1], RunFailed), (run_id, run[-1])
    else:
        assert isinstance(run[-1], RunSucceeded), (run_id, run[-1])
        assert json.loads(run[-1].result) == story.result, run_id

    def named(kind: type[Any]) -> Counter[str]:
        """Steps of facts of ``kind``, not counting a fan-out's items'."""
        return Counter(
            steps[f.step] for f in run if isinstance(f, kind) and getattr(f, "item", None) is None
        )

    once = Counter(dict.fromkeys(story.ran, 1))
    assert named(NodeReady) == once, (run_id, named(NodeReady))
    assert named(NodeSettled) == once, (run_id, named(NodeSettled))
    completed = Counter(dict.fromkeys(story.ran - story.failed, 1))
    assert named(StepCompleted) == completed, (run_id, named(StepCompleted))
    skipped = [(steps[f.step], f.reason) for f in run if isinstance(f, NodeSkipped)]
    assert sorted(skipped) == sorted(story.skipped), (run_id, skipped)
    assert [f.routes for f in run if isinstance(f, RouteDecided)] == story.routes, run_id
    caught = [(steps[f.step], steps[f.handler]) for f in run if isinstance(f, CatchDecided)]
    assert caught == story.caught, run_id
