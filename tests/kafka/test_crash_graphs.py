"""kill -9 a ``processor run`` on Kafka twice while graph runs are in flight.

The workload of ``tests/faults/test_crash_graphs.py`` (embedded log), smaller, on the
broker: ``mixed`` runs (parallel branches, a caught failure, a switch, a ``none_failed``
join, a finally step), ``routes`` runs (a route, the other, or one not declared),
``fanned`` runs (a fan-out under ``FAN_LIMIT``, some beyond their tolerance) and
``answered`` runs (an await branch that a ``Responder`` thread in this process answers).
The processor (with its in-process workers) is killed twice, each time after a random
amount of committed progress (a seeded RNG), and restarted; each kill leaves a
transaction open on the broker and a member in the group until its session times out.
At the end every run shows its story in the journal (``tests.apps.graph_stories``: one
terminal outcome, as its input implies; no fact key twice; no step's result admitted
twice; no unselected route run; each fan-out item settled once under the limit; each
await admitted once), runs.results holds one outcome per run, and ``replay --verify``
agrees with the live projections.
"""

from __future__ import annotations

import functools
import random
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from processor.clients.client import Client, new_submit
from processor.clients.external import Responder
from processor.facts.codec import decode_fact
from processor.facts.models import (
    BoundaryCompletionAdmitted,
    BoundaryInteractionDispatched,
    NodeReady,
)
from processor.facts.topics import TopicName
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
from tests.apps.support import TopicTail, wait_until
from tests.kafka.conftest import ProcessFactory
from tests.kafka.support import KafkaSpace, assert_replay_verifies, read_facts, read_outcomes

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

SEED = 20_261_205
RUNS = 60
#: Each restart costs seconds (fencing, group joins of the processor and its workers).
KILLS = 2
#: A fan-out's size (fewer items than on the embedded log: each one is a commit).
FAN_SIZES = (10, 24)


def test_kill_9_during_graph_runs_on_kafka_admits_each_step_once(
    space: KafkaSpace, processes: ProcessFactory, tmp_path: Path
) -> None:
    processor = processes("processor")
    processor.app = "tests.apps.graph_pipelines:app"
    deployment = space.deployment(tmp_path / "client")
    topology = deployment.topology
    client = Client(deployment.transport, topology, deployment.settings.state_dir)
    reader = deployment.transport.reader()
    facts_tail = TopicTail(reader, topology.name(TopicName.FACTS), topology.partitions)
    rng = random.Random(SEED)
    inputs: dict[str, Submitted] = {}
    ended: set[str] = set()
    mapping: set[str] = set()  # runs whose fan-out started items
    awaiting: set[str] = set()  # runs whose await asked, not yet answered
    responder = Responder(
        deployment.transport, topology, {GRAPH_APPROVALS: answer}, group=f"{space.tag}-answers"
    )
    stop_responder = threading.Event()
    responder_thread = threading.Thread(target=responder.run, args=(stop_responder,), daemon=True)

    def submit(count: int) -> None:
        for _ in range(count):
            run = random_run(rng, len(inputs), FAN_SIZES)
            command = new_submit(*run)
            inputs[command.run_id] = run
            client.send(command)
        client.flush()

    def progressed(target: int) -> bool:
        processor.check_alive()
        return facts_tail.end_total() >= target

    def all_ended() -> bool:
        processor.check_alive()
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
        processor.start()
        chunks = _chunks(RUNS, KILLS + 1)
        # (when, runs in flight at the kill, of them fan-outs mapping, awaits asked)
        kills: list[tuple[str, int, int, int]] = []
        # What a kill should land in, and whether one has: on a loaded machine the loop
        # takes bigger batches and the runs progress abreast, so a kill at a number of
        # facts alone can come before any fan-out maps its items (CI, once).
        states = {"fan-out": lambda: mapping - ended, "await": lambda: awaiting - ended}
        covered: set[str] = set()
        for chunk in chunks[:-1]:
            submit(chunk)
            # A graph run commits about 40 facts, in many small commits: a target within
            # the chunk's first part leaves runs in flight.
            target = facts_tail.end_total() + rng.randint(chunk * 2, chunk * 12)
            reached = functools.partial(progressed, target)
            wait_until(reached, 60, f"{target} facts", max_pause_s=0.01)
            needed = [state for name, state in states.items() if name not in covered]

            def landed(needed: list[Callable[[], set[str]]] = needed) -> bool:
                return all_ended() or not needed or any(state() for state in needed)

            wait_until(landed, 60, "a fan-out or an await open", max_pause_s=0.01)
            covered |= {name for name, state in states.items() if state()}
            when = f"at {target} facts"
            in_flight = len(inputs) - len(ended)
            kills.append((when, in_flight, len(mapping - ended), len(awaiting - ended)))
            assert processor.kill() == -9
            processor.start()
        submit(chunks[-1])
        assert all(in_flight > 0 for _, in_flight, _, _ in kills), kills
        # Some kill landed while a fan-out had items open, and one while an await waited.
        assert any(fans for _, _, fans, _ in kills), kills
        assert any(asked for _, _, _, asked in kills), kills

        wait_until(all_ended, 90, "every submitted run to end", max_pause_s=0.2)
        processor.check_alive()
        facts = read_facts(reader, topology)
        outcomes = read_outcomes(reader, topology)
        # Rebuilt from the journal, the projections equal the live ones.
        report = assert_replay_verifies(space, processor.data_dir)
    finally:
        stop_responder.set()
        responder_thread.join(30)
        client.close()
        reader.close()

    assert_each_run_once(facts, inputs)
    assert (report["facts"], report["runs"]) == (len(facts), len(inputs))
    assert Counter(o.run_id for o in outcomes) == Counter(dict.fromkeys(inputs, 1))
    failing = {run_id for run_id, run in inputs.items() if story(*run).result is None}
    assert {o.run_id for o in outcomes if o.status == "failed"} == failing
    assert {o.status for o in outcomes if o.run_id not in failing} == {"succeeded"}
    kinds = Counter(pipeline for pipeline, _ in inputs.values())
    assert all(kinds[p.name] > 0 for p in PIPELINES), kinds
    assert responder.answered >= kinds["answered"]


def _chunks(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]
