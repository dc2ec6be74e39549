"""A paused processor (SIGSTOP) loses its partitions; when it wakes up it is fenced.

SIGSTOP freezes the whole process, librdkafka's heartbeat threads included, so
the group evicts it after the session timeout and the other instance takes its
partitions over and carries on with its runs. On SIGCONT the zombie still holds
its old projections, in-flight batch and expired timers: whatever it tries to
commit must be refused. It logs the fence, drops its stores and rejoins. The
journal shows no fact key twice and every run succeeded exactly once.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from processor.client import Client, new_submit
from processor.transport.partitioner import partition_for
from tests.apps.pipelines import expected_steps3_result
from tests.apps.support import wait_until
from tests.kafka.conftest import ProcessFactory
from tests.kafka.support import (
    FactsWatch,
    KafkaSpace,
    assert_exactly_once,
    assert_outcomes_once,
    assert_replay_verifies,
    read_facts,
    read_outcomes,
)

pytestmark = pytest.mark.kafka

RUNS = 1_200
#: What the zombie's processor loop (or its host) logs when the log refuses its commit:
#: fenced by the group generation, or (when the paused transaction outlived
#: transaction.timeout.ms) refused because the broker already aborted it. Its worker
#: threads log their own fence, which is not the point here.
#: A zombie paused between transactions has nothing to commit: it learns on waking
#: that its partitions were lost (the session logs "lost"), and never commits.
FENCE_LOG = re.compile(
    r"WARNING processor\.(loop|host): .*(fenced|commit failed)"
    r"|INFO processor\.transport\.kafka_session: .*: lost "
)


def test_paused_instance_is_fenced_after_another_took_its_partitions(
    space: KafkaSpace, processes: ProcessFactory, tmp_path: Path
) -> None:
    zombie, survivor = processes("zombie"), processes("survivor")
    everything = set(range(space.partitions))
    deployment = space.deployment(tmp_path / "client")
    topology = deployment.topology
    client = Client(deployment.transport, topology, deployment.settings.state_dir)
    reader = deployment.transport.reader()
    watch = FactsWatch(reader, topology)
    inputs: dict[str, int] = {}

    def submit(count: int) -> list[str]:
        run_ids = []
        for _ in range(count):
            command = new_submit("steps3", {"n": len(inputs)})
            inputs[command.run_id] = len(inputs)
            run_ids.append(command.run_id)
            client.send(command)
        client.flush()
        return run_ids

    def partition(run_id: str) -> int:
        return partition_for(run_id.encode(), topology.partitions)

    def split() -> bool:
        zombie.check_alive()
        survivor.check_alive()
        mine, theirs = zombie.owned(), survivor.owned()
        return bool(mine and theirs) and not mine & theirs and mine | theirs == everything

    try:
        zombie.start()
        wait_until(lambda: zombie.owned() == everything, 60, "the first instance to own all")
        survivor.start()
        wait_until(split, 60, "the two instances to share the partitions")
        zombie_owns = zombie.owned()

        # Freeze the zombie mid-workload, with runs of its partitions in flight.
        workload = submit(RUNS)
        target = watch.committed() + 2_000
        wait_until(lambda: watch.committed() >= target, 60, "progress", max_pause_s=0.01)
        zombie.pause()
        paused_at = time.monotonic()
        ended = set(watch.refresh())
        stranded = [r for r in workload if r not in ended and partition(r) in zombie_owns]
        assert stranded, "no run of the zombie's partitions was in flight"

        # The survivor takes the zombie's partitions and finishes its stranded runs.
        wait_until(lambda: survivor.owned() == everything, 60, "the survivor to own all")
        assert time.monotonic() - paused_at < 30
        wait_until(lambda: watch.all_ended(stranded), 60, "the survivor to finish them")
        assert zombie.owned() == zombie_owns  # frozen: it has not noticed anything

        # Wake the zombie: its commit is refused, it says so, and it rejoins the group.
        zombie.resume()
        wait_until(lambda: FENCE_LOG.search(zombie.log_text()), 30, "the zombie to log the fence")
        wait_until(split, 60, "the woken instance to rejoin and share again")

        wait_until(lambda: watch.all_ended(inputs), 120, "every run to end", max_pause_s=0.2)
        zombie_log, survivor_log = zombie.log_text(), survivor.log_text()
        assert zombie.stop() == 0, zombie_log[-3000:]
        assert survivor.stop() == 0, survivor_log[-3000:]
    finally:
        client.close()

    try:
        facts = read_facts(reader, topology)
        outcomes = read_outcomes(reader, topology)
    finally:
        reader.close()
    assert_exactly_once(facts, inputs, result=expected_steps3_result)
    assert_outcomes_once(outcomes, inputs)
    assert_replay_verifies(space, zombie.data_dir)
    assert_replay_verifies(space, survivor.data_dir)
