"""A partition's RocksDB store is lost between two runs of the processor: rebuilt from runs.facts.

The projections are a pure fold of the journal, so deleting one partition's store
directory (``<data_dir>/state/<group>/pNNNN``) loses nothing: on assignment the
processor finds no store, rebuilds it from runs.facts offset 0, and carries on.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from processor.clients.client import Client
from processor.facts.topics import TopicName
from processor.restore.replay import replay
from processor.transport.base import TopicPartition
from processor.transport.partitioner import partition_for
from tests.apps.support import wait_until
from tests.kafka.conftest import ProcessFactory
from tests.kafka.support import (
    FactsWatch,
    KafkaSpace,
    assert_replay_verifies,
    assert_steps3_once,
    submit_steps3,
)

pytestmark = pytest.mark.kafka

LOST = 1  # the partition whose store is deleted
BEFORE, AFTER = 200, 40


def test_deleted_partition_store_is_rebuilt_from_the_journal(
    space: KafkaSpace, processes: ProcessFactory, tmp_path: Path
) -> None:
    processor = processes("processor")
    deployment = space.deployment(tmp_path / "client")
    topology = deployment.topology
    client = Client(deployment.transport, topology, deployment.settings.state_dir)
    reader = deployment.transport.reader()
    watch = FactsWatch(reader, topology)
    inputs: dict[str, int] = {}
    store = space.settings(processor.data_dir).state_dir / f"p{LOST:04d}"

    def submit(count: int) -> list[str]:
        return submit_steps3(client, inputs, count)

    def ended(run_ids: list[str]) -> bool:
        processor.check_alive()
        return watch.all_ended(run_ids)

    try:
        processor.start()
        before = submit(BEFORE)
        wait_until(lambda: ended(before), 60, "the first runs to end")
        assert processor.stop() == 0
        lost_runs = [r for r in before if partition_for(r.encode(), topology.partitions) == LOST]
        assert lost_runs
        facts_tp = TopicPartition(topology.name(TopicName.FACTS), LOST)
        in_journal = sum(len(batch) for batch in reader.read(facts_tp, 0))

        assert (store / "CURRENT").exists()
        shutil.rmtree(store)

        processor.start()
        rebuilt = f"partition {LOST}: caught up {in_journal} facts from offset 0"
        wait_until(lambda: rebuilt in processor.log_text(), 60, "the store to be rebuilt")
        log = processor.log_text()
        assert f"partition {LOST}: no store, rebuilding from runs.facts offset 0" in log
        for other in set(range(topology.partitions)) - {LOST}:
            assert f"partition {other}: no store" not in log  # only the lost one is rebuilt

        # The rebuilt projections know the old runs, and new runs work.
        state_dir = space.settings(processor.data_dir).state_dir
        statuses = Client(deployment.transport, topology, state_dir)
        for run_id in lost_runs:
            state = statuses.stored_status(run_id)
            assert state is not None and state.status == "succeeded", run_id
            assert state.version == len(statuses.stored_history(run_id))
        after = submit(AFTER)
        assert LOST in {partition_for(r.encode(), topology.partitions) for r in after}
        wait_until(lambda: ended(after), 60, "the new runs to end")
        assert processor.stop() == 0, processor.log_text()[-3000:]
    finally:
        client.close()

    assert_steps3_once(reader, topology, inputs)
    report = assert_replay_verifies(space, processor.data_dir)
    assert report["runs"] == BEFORE + AFTER
    # From a machine without the stores, status and history read runs.facts.
    elsewhere = tmp_path / "elsewhere"
    run_id = lost_runs[0]
    shown = space.cli(elsewhere, "status", run_id, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["status"] == "succeeded"
    listed = space.cli(elsewhere, "history", run_id, "--json")
    assert listed.returncode == 0, listed.stderr
    assert [row["seq"] for row in json.loads(listed.stdout)] == list(
        range(1, len(json.loads(listed.stdout)) + 1)
    )
    assert json.loads(listed.stdout)[-1]["type"] == "RunSucceeded"
    # The same rebuilt by a pool of processes, each with a Kafka reader of its own.
    in_processes = assert_replay_verifies(space, processor.data_dir, "--processes", "2")
    assert (in_processes["processes"], in_processes["facts"]) == (2, report["facts"])

    # In process, its progress reaches the offsets to read: transaction markers too.
    totals: list[int] = []
    advanced: list[int] = []

    def progress_total(total: int) -> Callable[[int], None]:
        totals.append(total)
        return advanced.append

    again = replay(
        deployment.transport,
        topology,
        tmp_path / "unused",
        target_dir=tmp_path / "replayed",
        progress_total=progress_total,
        processes=2,
    )
    assert (again.processes, again.facts) == (2, report["facts"])
    assert totals[0] > again.facts  # every committed transaction ends with a marker
    assert sum(advanced) == totals[0]
