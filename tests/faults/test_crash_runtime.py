"""kill -9 a real ``processor run`` at random moments while its runs mix async steps that
heartbeat, durable sleeps and sync steps: every run ends exactly once, with the result
its input determines, and ``replay --verify`` agrees with the live state."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from processor.clients.client import Client, new_submit
from processor.facts import payload
from processor.facts.codec import decode_fact
from processor.facts.models import (
    AttemptStepStarted,
    FactHeader,
    RunFailed,
    RunStopped,
    RunSucceeded,
    SleepCompleted,
    SleepStarted,
)
from processor.facts.topics import TopicName
from processor.transport.deployment import ensure_topics
from tests.apps.runtime_pipelines import expected_mixed_result
from tests.apps.support import TopicTail, read_topic, wait_until
from tests.faults.crash_env import CrashEnv

pytestmark = pytest.mark.slow

SEED = 20
RUNS = 16
#: Kills by transport: on Kafka each restart waits for the killed transaction's abort.
KILLS = {"embedded": 3, "kafka": 1}


def test_kill_9_during_async_steps_sleeps_and_heartbeats(crash_env: CrashEnv) -> None:
    process = crash_env.process
    process.app = "tests.apps.runtime_pipelines:app"
    deployment = crash_env.deployment
    ensure_topics(deployment)
    topology = deployment.topology
    client = Client(deployment.transport, topology, deployment.settings.state_dir)
    reader = deployment.transport.reader()
    tail = TopicTail(reader, topology.name(TopicName.FACTS), topology.partitions)
    rng = random.Random(SEED)
    inputs: dict[str, int] = {}
    ended: set[str] = set()

    def all_ended() -> bool:
        process.check_alive()
        for record in tail.new():
            fact = decode_fact(record.value)
            if isinstance(fact, RunSucceeded | RunFailed | RunStopped):
                ended.add(fact.run_id)
        return ended >= inputs.keys()

    def progressed(target: int) -> bool:
        process.check_alive()
        return tail.end_total() >= target

    try:
        process.start()
        for n in range(RUNS):
            command = new_submit("e2e_mixed", {"n": n})
            inputs[command.run_id] = n
            client.send(command)
        client.flush()
        in_flight = []
        for _ in range(KILLS[crash_env.transport]):
            # After a random amount of progress: in a step, a sleep, or between them.
            target = tail.end_total() + rng.randint(1, RUNS * 3)
            wait_until(lambda t=target: progressed(t), 60, f"{target} facts", max_pause_s=0.01)
            all_ended()
            in_flight.append(RUNS - len(ended))
            assert process.kill() == -9
            process.start()
        assert any(in_flight), in_flight  # the kills came while runs were in flight
        wait_until(all_ended, 90, "every run to end", max_pause_s=0.2)
        assert process.stop() == 0, process.log_text()[-3000:]
    finally:
        client.close()

    facts: dict[str, list[FactHeader]] = {run_id: [] for run_id in inputs}
    for record in read_topic(reader, topology.name(TopicName.FACTS), topology.partitions):
        fact = decode_fact(record.value)
        facts.setdefault(fact.run_id, []).append(fact)
    reader.close()
    for run_id, n in inputs.items():
        found = facts[run_id]
        terminal = [f for f in found if isinstance(f, RunSucceeded | RunFailed | RunStopped)]
        assert len(terminal) == 1, (run_id, terminal)  # terminal exactly once
        (succeeded,) = terminal
        assert isinstance(succeeded, RunSucceeded), succeeded
        assert payload.loads(succeeded.result) == expected_mixed_result(n)
        assert [f.seq for f in found] == list(range(1, len(found) + 1))  # gapless
        assert len({f.fact_key for f in found}) == len(found)  # no duplicates
        # The sleep was started once and fired once, at its recorded wake time or later.
        (slept,) = (f for f in found if isinstance(f, SleepStarted))
        (woke,) = (f for f in found if isinstance(f, SleepCompleted))
        assert woke.wake_ms == slept.wake_ms <= woke.time_ms
    kinds = Counter(type(f).__name__ for run in facts.values() for f in run)
    # Steps with a heartbeat timeout report their start at once: two steps a run.
    assert kinds[AttemptStepStarted.__name__] >= 2 * RUNS

    verify = crash_env.cli("replay", "--verify", "--json")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    report = json.loads(verify.stdout)
    assert report["verified"] is True, report["differences"]
