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
reports running) and restarted each time. At the end, from the journal, every run
shows its story (``tests.apps.graph_stories``: ended exactly once, as its input implies,
no step's result admitted twice, no route not taken run, each fan-out item settled
once under the limit, each await admitted once, no fact key twice), runs.results holds
one outcome per run, and ``replay --verify`` agrees with the live projections.
"""

from __future__ import annotations

import functools
import json
import random
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from processor.clients.client import Client, new_submit
from processor.clients.external import Responder
from processor.config.settings import Settings
from processor.facts.codec import codec, decode_fact
from processor.facts.models import (
    BoundaryCompletionAdmitted,
    BoundaryInteractionDispatched,
    NodeReady,
    RunOutcome,
)
from processor.facts.topics import TopicName
from processor.transport.deployment import Deployment, ensure_topics
from tests.apps.graph_pipelines import GRAPH_APPROVALS
from tests.apps.graph_stories import (
    PIPELINES,
    TERMINAL,
    Submitted,
    answer,
    assert_each_run_once,
    random_run,
    story,
)
from tests.apps.support import ProcessorProcess, TopicTail, cli, read_topic, wait_until

pytestmark = pytest.mark.slow

SEED = 20_251_205
RUNS = 360
KILLS = 6


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
    inputs: dict[str, Submitted] = {}
    ended: set[str] = set()
    responder = Responder(
        deployment.transport, topology, {GRAPH_APPROVALS: answer}, group="graph-responder"
    )
    stop_responder = threading.Event()
    responder_thread = threading.Thread(target=responder.run, args=(stop_responder,), daemon=True)

    def submit(count: int) -> None:
        for _ in range(count):
            run = random_run(rng, len(inputs))
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
    assert_each_run_once(facts, inputs)
    assert Counter(o.run_id for o in outcomes) == Counter(dict.fromkeys(inputs, 1))
    failing = {run_id for run_id, run in inputs.items() if story(*run).result is None}
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
