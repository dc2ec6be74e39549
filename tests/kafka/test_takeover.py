"""Two processors in one group share the partitions; kill -9 one and the other takes over.

Each instance has its own data directory (its own RocksDB stores), as on two
machines. Ownership is read from the instances' logs ("assigned"/"revoked"
lines) and proven by the runs each one finished in its own projections. After
the kill the survivor gets the dead member's partitions once its session times
out, catches their stores up from runs.facts, and finishes every run: each
succeeds exactly once, no (run id, fact key) is in the journal twice.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from processor.clients.client import Client
from processor.transport.partitioner import partition_for
from tests.apps.support import wait_until
from tests.kafka.conftest import ProcessFactory
from tests.kafka.support import (
    FactsWatch,
    KafkaSpace,
    assert_replay_verifies,
    assert_steps3_once,
    shared_by,
    submit_steps3,
    wait_all_ended,
)

pytestmark = pytest.mark.kafka

WARM_UP = 40
RUNS = 1_000


def test_survivor_takes_over_the_partitions_of_a_killed_instance(
    space: KafkaSpace, processes: ProcessFactory, tmp_path: Path
) -> None:
    survivor, victim = processes("survivor"), processes("victim")
    # Whatever the size, restore the partitions it takes over in a pool of processes.
    survivor.extra_env["PROCESSOR_PARALLEL_RESTORE_MIN_FACTS"] = "1"
    everything = set(range(space.partitions))
    deployment = space.deployment(tmp_path / "client")
    topology = deployment.topology
    client = Client(deployment.transport, topology, deployment.settings.state_dir)
    reader = deployment.transport.reader()
    watch = FactsWatch(reader, topology)
    inputs: dict[str, int] = {}

    def submit(count: int) -> list[str]:
        return submit_steps3(client, inputs, count)

    def partition(run_id: str) -> int:
        return partition_for(run_id.encode(), topology.partitions)

    try:
        survivor.start()
        wait_until(lambda: survivor.owned() == everything, 60, "the first instance to own all")
        victim.start()
        wait_until(lambda: shared_by(survivor, victim, space.partitions), 60, "a shared group")
        survivor_owns, victim_owns = survivor.owned(), victim.owned()

        # Both instances process runs: each finished run is in its owner's projections.
        warm_up = submit(WARM_UP)
        assert {partition(r) for r in warm_up} == everything  # 40 runs hit all 4 partitions
        wait_until(lambda: watch.all_ended(warm_up), 60, "the warm-up runs to end")
        owner_of = {p: survivor for p in survivor_owns} | {p: victim for p in victim_owns}
        for run_id in warm_up:
            owner = owner_of[partition(run_id)]
            state_dir = space.settings(owner.data_dir).state_dir
            state = Client(deployment.transport, topology, state_dir).stored_status(run_id)
            assert state is not None and state.status == "succeeded", (run_id, owner.data_dir)

        # kill -9 the victim mid-workload, with runs of its partitions in flight.
        # The target counts from before the submits: on a loaded machine they take long
        # enough for much of the work to be done by the time they are all sent.
        target = watch.committed() + 2_000  # about 11 facts per run: a fifth of the work
        workload = submit(RUNS)
        wait_until(lambda: watch.committed() >= target, 60, "progress", max_pause_s=0.01)
        victim.check_alive()
        ended = watch.refresh()
        # What the victim owns as it dies (a rebalance since the warm-up may have moved
        # some): the partitions the survivor must catch up.
        victim_owns = victim.owned()
        in_flight = [r for r in workload if r not in ended]
        assert any(partition(r) in victim_owns for r in in_flight)
        logged_before_kill = len(survivor.log_text())
        assert victim.kill() == -9
        killed_at = time.monotonic()

        wait_until(lambda: survivor.owned() == everything, 60, "the survivor to own all")
        took_over_s = time.monotonic() - killed_at
        assert took_over_s < 30, took_over_s  # a 6 s session timeout, then one rebalance
        wait_all_ended(watch, inputs, survivor, 120)
        # The runs may all have ended before the survivor caught up with them (the
        # victim's last transaction ended the ones in flight): wait for its catch-up.
        wait_until(
            lambda: all(f"partition {p}: caught up" in survivor.log_text() for p in victim_owns),
            60,
            "the survivor to catch up the victim's partitions",
        )
        survivor.check_alive()
        log = survivor.log_text()
        restored = re.search(  # the takeover's restore (not one of an earlier rebalance)
            r"restoring \d+ facts of partitions ([\d, ]+) in 2 processes", log[logged_before_kill:]
        )
        assert restored, log[-3000:]
        assert victim_owns <= {int(p) for p in restored.group(1).split(", ")}
        assert survivor.stop() == 0, log[-3000:]
    finally:
        client.close()

    assert_steps3_once(reader, topology, inputs)
    report = assert_replay_verifies(space, survivor.data_dir)
    assert report["runs"] == len(inputs)
    assert_replay_verifies(space, victim.data_dir)  # what the victim had applied is consistent
