"""kill -9 a ``processor run`` on Kafka again and again while thousands of runs are in flight.

Twice: with workers running the steps, and with the processor running them itself and
writing a run's facts of a transaction as one record (inline steps, fact batches).

Like ``tests/faults/test_crash_recovery.py`` on the embedded log: runs are
submitted in chunks from this process; after each chunk the processor is killed
at a moment chosen by a seeded RNG (after a random amount of committed progress,
or as soon as it reports that it is running) and started again. Each kill
leaves a transaction open on the broker and a member in the group until its
session times out. Afterwards the journal must show every run succeeded
exactly once, no fact key twice, gapless sequence numbers, and
``replay --verify`` must agree with the live projections.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from processor.clients.client import Client
from processor.facts.topics import TopicName
from tests.apps.support import assert_facts_batched, read_topic, wait_until
from tests.kafka.conftest import ProcessFactory
from tests.kafka.support import (
    FactsWatch,
    KafkaSpace,
    assert_replay_verifies,
    assert_steps3_once,
    submit_steps3,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

SEED = 20_251_129
RUNS = 2_100
KILLS = 6


@pytest.mark.parametrize("steps", ["workers", "inline"])
def test_kill_9_during_load_on_kafka_loses_and_duplicates_nothing(
    space: KafkaSpace, processes: ProcessFactory, tmp_path: Path, steps: str
) -> None:
    processor = processes("processor")
    if steps == "inline":  # the processor runs the steps itself (engine/inline.py)
        # A whole run commits at once then: small batches leave runs in flight to kill.
        # Its facts of a transaction leave as one record (facts/fact_batch.py).
        processor.extra_env |= {
            "PROCESSOR_INLINE_STEPS": "true",
            "PROCESSOR_MAX_BATCH": "20",
            "PROCESSOR_FACT_BATCHES": "true",
        }
    deployment = space.deployment(tmp_path / "client")
    topology = deployment.topology
    client = Client(deployment.transport, topology, deployment.settings.state_dir)
    reader = deployment.transport.reader()
    watch = FactsWatch(reader, topology)
    rng = random.Random(SEED)
    inputs: dict[str, int] = {}

    def submit(count: int) -> None:
        submit_steps3(client, inputs, count)

    def progressed(target: int) -> bool:
        processor.check_alive()
        return watch.committed() >= target

    def all_ended() -> bool:
        processor.check_alive()
        return watch.all_ended(inputs)

    try:
        processor.start()
        chunks = _chunks(RUNS, KILLS + 1)
        at_start = set(rng.sample(range(KILLS), 2))
        kills: list[tuple[str, int]] = []  # (when, runs in flight at the kill)
        for round_, chunk in enumerate(chunks[:-1]):
            submit(chunk)
            if round_ in at_start:
                # As soon as it says it runs: while it joins the group or restores.
                processor.wait_running()
                when = "at start"
            else:
                # After a random amount of progress since the last kill, at most about a
                # fifth of what the chunk just submitted needs (about 10 facts a run):
                # the processor commits up to 500 inputs per transaction, so progress
                # comes in jumps, and a target near the chunk's end can be passed by
                # the very commit that ends its last runs.
                # With fact batches (inline) a run writes about two records, not ten.
                span = chunk // 2 if steps == "inline" else chunk * 2
                target = watch.committed() + rng.randint(1, span)
                wait_until(lambda t=target: progressed(t), 90, f"{target} facts", max_pause_s=0.01)
                when = f"at {target} facts"
            assert processor.kill() == -9
            # Nothing commits after the kill: what has not ended now was in flight.
            kills.append((when, len(inputs) - len(watch.refresh())))
            processor.start()
        submit(chunks[-1])
        assert len(inputs) >= 2_000
        assert len(kills) >= 5
        assert all(in_flight > 0 for _, in_flight in kills), kills

        wait_until(all_ended, 120, "every submitted run to end", max_pause_s=0.2)
        assert processor.stop() == 0, processor.log_text()[-3000:]
    finally:
        client.close()

    if steps == "inline":  # every segment ran in the processor, none in its workers
        assert not list(read_topic(reader, topology.name(TopicName.WORK), topology.partitions))
        assert_facts_batched(reader, topology)
    facts = assert_steps3_once(reader, topology, inputs)
    report = assert_replay_verifies(space, processor.data_dir)
    assert report["facts"] == len(facts)
    assert report["runs"] == len(inputs)


def _chunks(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]
