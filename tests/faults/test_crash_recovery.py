"""kill -9 a real ``processor run`` process again and again while runs are in flight
(its steps run by its workers; or by itself, its facts of a transaction written as one
record: ``PROCESSOR_INLINE_STEPS`` and ``PROCESSOR_FACT_BATCHES``).

The test submits thousands of runs from this process, kills the processor at
moments chosen by a seeded RNG (after a random amount of committed progress, or
right after it reports that it is running), restarts it, and finally checks the
journal: every run succeeded exactly once, no fact key repeats within a run,
sequence numbers are gapless, and ``replay --verify`` agrees with the live
projections.
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from processor.clients.client import Client, new_submit
from processor.config.settings import Settings
from processor.facts.codec import codec, decode_fact
from processor.facts.models import FactHeader, RunFailed, RunOutcome, RunSucceeded
from processor.facts.topics import TopicName
from processor.transport.deployment import Deployment, ensure_topics
from tests.apps.pipelines import expected_steps3_result
from tests.apps.support import (
    ProcessorProcess,
    TopicTail,
    assert_facts_batched,
    cli,
    read_topic,
    wait_until,
)

pytestmark = pytest.mark.slow

SEED = 20_241_129
RUNS = 2_100
KILLS = 6


@pytest.fixture(params=["workers", "inline"])
def processor_process(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ProcessorProcess]:
    """``processor run`` with its workers; or running the steps itself (engine/inline.py)."""
    process = ProcessorProcess(tmp_path / "data", tmp_path / "processor.log", workers=2)
    if request.param == "inline":
        # A whole run commits at once here: small batches leave runs in flight to kill.
        # Its facts of a transaction leave as one record (facts/fact_batch.py).
        process.extra_env |= {
            "PROCESSOR_INLINE_STEPS": "true",
            "PROCESSOR_MAX_BATCH": "20",
            "PROCESSOR_FACT_BATCHES": "true",
        }
    try:
        yield process
    finally:
        process.close()


def test_kill_9_during_load_loses_and_duplicates_nothing(
    processor_process: ProcessorProcess,
) -> None:
    data_dir = processor_process.data_dir
    deployment = Deployment.from_settings(Settings(data_dir=data_dir))
    ensure_topics(deployment)
    topology = deployment.topology
    client = Client(deployment.transport, topology, deployment.settings.state_dir)
    reader = deployment.transport.reader()
    facts_tail = TopicTail(reader, topology.name(TopicName.FACTS), topology.partitions)
    batched = processor_process.extra_env.get("PROCESSOR_FACT_BATCHES") == "true"
    rng = random.Random(SEED)

    inputs: dict[str, int] = {}
    ended: set[str] = set()

    def submit(count: int) -> None:
        for _ in range(count):
            n = len(inputs)
            command = new_submit("steps3", {"n": n})
            inputs[command.run_id] = n
            client.send(command)
        client.flush()

    def committed_facts() -> int:
        return facts_tail.end_total()

    def progressed(target: int) -> bool:
        processor_process.check_alive()
        return committed_facts() >= target

    def all_ended() -> bool:
        processor_process.check_alive()
        for record in facts_tail.new():
            fact = decode_fact(record.value)
            if isinstance(fact, RunSucceeded | RunFailed):
                ended.add(fact.run_id)
        return ended >= inputs.keys()

    try:
        processor_process.start()
        chunks = _chunks(RUNS, KILLS + 1)
        at_start = set(rng.sample(range(KILLS), 2))
        kills: list[tuple[str, int]] = []  # (when, runs in flight at the kill)
        for round_, chunk in enumerate(chunks[:-1]):
            submit(chunk)
            if round_ in at_start:
                # Kill as soon as it says it runs: often while restoring its stores.
                processor_process.wait_running()
                when = "at start"
            else:
                # Kill after a random amount of committed progress since the last kill:
                # at most two facts per run of the chunk just submitted (each run needs
                # several). The processor commits up to 500 inputs per transaction,
                # so progress comes in jumps, and a target near the chunk's end can be
                # passed by the very commit that ends its last runs (none in flight).
                # With fact batches a run writes about two records (one a transaction).
                span = chunk // 2 if batched else chunk * 2
                target = committed_facts() + rng.randint(1, span)
                wait_until(lambda t=target: progressed(t), 90, f"{target} facts", max_pause_s=0.01)
                when = f"at {target} facts"
            all_ended()
            kills.append((when, len(inputs) - len(ended)))
            assert processor_process.kill() == -9
            processor_process.start()
        submit(chunks[-1])
        assert len(inputs) >= 2_000
        assert len(kills) >= 5
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
    work = list(read_topic(reader, topology.name(TopicName.WORK), topology.partitions))
    if processor_process.extra_env.get("PROCESSOR_INLINE_STEPS"):
        assert work == []  # every segment ran in the processor, none in its workers
        assert_facts_batched(reader, topology)
    reader.close()
    _assert_exactly_once(facts, inputs)
    assert Counter(o.run_id for o in outcomes) == Counter(dict.fromkeys(inputs, 1))
    assert {o.status for o in outcomes} == {"succeeded"}

    verify = cli(data_dir, "replay", "--verify", "--json")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    report = json.loads(verify.stdout)
    assert report["verified"] is True, report["differences"]
    assert report["facts"] == len(facts)
    assert report["runs"] == len(inputs)


def _chunks(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _assert_exactly_once(facts: list[FactHeader], inputs: dict[str, int]) -> None:
    by_run: dict[str, list[FactHeader]] = defaultdict(list)
    for fact in facts:
        by_run[fact.run_id].append(fact)
    assert by_run.keys() == inputs.keys(), "facts of unknown runs, or runs without facts"

    keys = Counter((f.run_id, f.fact_key) for f in facts)
    duplicated = [key for key, count in keys.items() if count > 1]
    assert duplicated == [], f"fact keys appended twice: {duplicated[:5]}"

    for run_id, run in by_run.items():
        assert [f.seq for f in run] == list(range(1, len(run) + 1)), run_id
        succeeded = [f for f in run if isinstance(f, RunSucceeded)]
        assert len(succeeded) == 1, run_id
        assert not any(isinstance(f, RunFailed) for f in run), run_id
        assert run[-1] is succeeded[0], run_id
        assert json.loads(succeeded[0].result) == expected_steps3_result(inputs[run_id])
