"""An event by correlation key reaches runs owned by two processors (issue 29, item 1).

Two ``processor run`` instances share the partitions, each with its own stores, as on
two machines. Runs of ``paid`` wait on one order number, on partitions of both
instances, and one run waits on another order. One event by that order number: the
instance owning the key's partition asks the runs of its partitions, forwards it to a
partition of the other, whose owner asks its own:
admits it to the runs it holds that wait on the key. Each of those runs gets it once
and ships with its payload; the run waiting on another key is not asked; both stores
pass ``replay --verify``. An event by a key no run waits on goes through both
instances' partitions and is refused once, with the reason, by the one that saw the
last of them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from processor.clients.client import Client
from processor.facts.codec import codec
from processor.facts.models import BoundaryCompletionAdmitted, Rejected, RunSucceeded
from processor.facts.topics import TopicName
from processor.model.state import RunState
from processor.transport.partitioner import partition_for
from tests.apps.support import read_topic, wait_until
from tests.kafka.conftest import ProcessFactory
from tests.kafka.support import KafkaSpace, assert_replay_verifies, read_facts, shared_by

pytestmark = pytest.mark.kafka

APP = "tests.apps.event_pipelines:app"
ORDER = "o-shared"


def test_an_event_by_key_reaches_waiting_runs_owned_by_two_processors(
    space: KafkaSpace, processes: ProcessFactory, tmp_path: Path
) -> None:
    first, second = processes("first"), processes("second")
    for process in (first, second):
        process.app = APP
    deployment = space.deployment(tmp_path / "client")
    topology = deployment.topology
    client = Client(deployment.transport, topology, deployment.settings.state_dir)
    reader = deployment.transport.reader()

    def partition(run_id: str) -> int:
        return partition_for(run_id.encode(), topology.partitions)

    def waiting(run_id: str) -> bool:
        state: RunState | None = client.status(run_id)
        return state is not None and state.phase == "suspended"

    try:
        first.start()
        first.wait_running(120)
        second.start()
        wait_until(lambda: shared_by(first, second, space.partitions), 60, "a shared group")
        owner = {p: first for p in first.owned()} | {p: second for p in second.owned()}

        # Runs on the key until both instances hold some, and one on another key.
        runs: list[str] = []
        while {owner[partition(r)].data_dir for r in runs} != {first.data_dir, second.data_dir}:
            runs.append(client.submit("paid", {"order": ORDER, "region": "eu"}).run_id)
        other = client.submit("paid", {"order": "o-other", "region": "eu"}).run_id
        for run_id in [*runs, other]:
            wait_until(lambda r=run_id: waiting(r), 60, f"run {run_id} to wait")

        client.signal("payment_received", {"paid": 5}, key=ORDER, correlation={"region": "eu"})
        client.flush()

        def shipped() -> set[str]:
            return {f.run_id for f in read_facts(reader, topology) if isinstance(f, RunSucceeded)}

        wait_until(lambda: set(runs) <= shipped(), 60, "every run on the key to ship")
        facts = read_facts(reader, topology)
        for run_id in runs:
            state = client.status(run_id)
            assert state is not None and state.status == "succeeded", run_id
            assert json.loads(state.result or b"null") == {"shipped": {"paid": 5}}
        admitted = [f.run_id for f in facts if isinstance(f, BoundaryCompletionAdmitted)]
        assert sorted(admitted) == sorted(runs)  # once each, and not the other key's run
        assert waiting(other)

        client.signal("payment_received", {"paid": 6}, key="o-nobody")
        client.flush()

        def refusals() -> list[Rejected]:
            records = read_topic(reader, topology.name(TopicName.REJECTED), topology.partitions)
            found = [codec().decode_as(r.value, Rejected) for r in records]
            return [r for r in found if r.original_key == b"o-nobody"]

        wait_until(refusals, 60, "the event by an unknown key refused")
        (refusal,) = refusals()  # once, though it went through both instances
        assert (refusal.reason, refusal.run_id) == ("no_matching_wait", None)
        assert "o-nobody" in refusal.detail
        for process in (first, second):
            assert process.stop() == 0, process.log_text()[-3000:]
    finally:
        client.close()
        reader.close()
    for process in (first, second):
        assert_replay_verifies(space, process.data_dir)
