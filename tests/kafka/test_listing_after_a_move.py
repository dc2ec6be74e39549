"""A processor lists only the runs of the partitions it owns (README, "Listing runs").

Two processors of one group, each with its own data directory, as on two machines.
The first owns every partition while runs wait at an await; the second joins and
takes some partitions; the waiting runs of those are then answered and succeed on
the second. The first keeps the moved partitions' stores on its disk (a revoke
keeps them, for a quick return): they still show those runs waiting, with their
resume tokens. Neither its HTTP API (``/api/runs``, ``/api/requests``) nor the CLI
on its state directory (``processor runs``, ``processor requests``) may show them:
each lists the partitions it owns now, and says which. With the first stopped, its
state directory owns nothing: the CLI there lists nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from processor.clients.client import Client, new_submit
from processor.clients.external import CompletionClient
from processor.transport.partitioner import partition_for
from tests.apps.control_pipelines import APPROVALS
from tests.apps.support import wait_until
from tests.kafka.conftest import ProcessFactory
from tests.kafka.support import KafkaProcessorProcess, KafkaSpace, shared_by

pytestmark = pytest.mark.kafka

APP = "tests.apps.control_pipelines:app"  # ``approval`` waits 600 s at its await
TOKEN = "listing-test-token"
RUNS_PER_PARTITION = 3
#: From a rebalance or a completion to what it leads to.
WITHIN_S = 60.0


class Instance:
    """One processor and what its operator sees: its HTTP API and the CLI on its data dir."""

    def __init__(self, space: KafkaSpace, process: KafkaProcessorProcess) -> None:
        self.space, self.process = space, process
        process.app = APP
        process.extra_env = {"PROCESSOR_HTTP_TOKEN": TOKEN}

    def get(self, path: str) -> dict[str, Any]:
        url = self.process.http_address()
        assert url is not None, "not serving yet"
        answer = httpx.get(url + path, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        return body

    def ready(self) -> bool:
        url = self.process.http_address()
        return url is not None and httpx.get(f"{url}/readyz", timeout=30).status_code == 200

    def cli(self, *args: str) -> Any:
        done = self.space.cli(self.process.data_dir, *args, "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)


def listings(instance: Instance) -> dict[str, tuple[list[int] | None, set[str]]]:
    """What each listing of ``instance`` shows: the partitions it says it covers (the CLI's
    ``requests``, a bare list, says none) and the run ids it lists."""
    api_runs = instance.get("/api/runs?limit=1000")
    api_requests = instance.get("/api/requests")
    cli_runs = instance.cli("runs", "--limit", "1000")
    cli_requests = instance.cli("requests")
    return {
        "/api/runs": (api_runs.get("partitions"), {r["run_id"] for r in api_runs["runs"]}),
        "/api/requests": (
            api_requests.get("partitions"),
            {r["run_id"] for r in api_requests["requests"]},
        ),
        "processor runs": (cli_runs.get("partitions"), {r["run_id"] for r in cli_runs["runs"]}),
        "processor requests": ([], {r["run_id"] for r in cli_requests}),
    }


def test_a_processor_lists_only_the_partitions_it_owns_after_a_move(
    space: KafkaSpace, processes: ProcessFactory, tmp_path: Path
) -> None:
    first = Instance(space, processes("first"))
    second = Instance(space, processes("second"))
    everything = set(range(space.partitions))
    deployment = space.deployment(tmp_path / "client")
    client = Client(deployment.transport, deployment.topology, deployment.settings.state_dir)
    sender = CompletionClient(deployment.transport, deployment.topology)

    def partition(run_id: str) -> int:
        return partition_for(run_id.encode(), space.partitions)

    try:
        first.process.start()
        wait_until(lambda: first.process.owned() == everything, WITHIN_S, "the first to own all")
        wait_until(first.ready, WITHIN_S, "the first to be ready")
        runs = _submit_approvals(client, partition, space.partitions)
        tokens = wait_until(
            lambda: _tokens(first, runs), WITHIN_S, "every run to wait, listed by the first"
        )

        second.process.start()
        wait_until(
            lambda: shared_by(first.process, second.process, space.partitions),
            WITHIN_S,
            "the partitions shared by both",
        )
        wait_until(second.ready, WITHIN_S, "the second to catch its partitions up")
        kept, moved_to = sorted(first.process.owned()), second.process.owned()
        moved = {run_id for run_id in runs if partition(run_id) in moved_to}
        for run_id in moved:  # the runs that moved end on the second instance
            sender.complete(tokens[run_id], {"approved": True})
        wait_until(
            lambda: all(_status(client, run_id) == "succeeded" for run_id in moved),
            WITHIN_S,
            "the moved runs to succeed on the second",
        )

        # The first lists what it owns, and says so; the moved runs, stale on its disk, never.
        mine = {run_id for run_id in runs if partition(run_id) in kept}
        expected = {
            "/api/runs": (kept, mine),
            "/api/requests": (kept, mine),
            "processor runs": (kept, mine),
            "processor requests": ([], mine),
        }
        shown: dict[str, tuple[list[int] | None, set[str]]] = {}

        def first_lists_its_own() -> bool:
            shown.update(listings(first))
            return shown == expected

        try:
            wait_until(first_lists_its_own, WITHIN_S, "the first to list its partitions only")
        finally:
            stale = {name: sorted(ids & moved) for name, (_, ids) in shown.items() if ids & moved}
            print(f"runs of moved partitions listed by the first: {stale}")
        owner = second.get("/api/runs?limit=1000&status=succeeded")
        assert moved <= {r["run_id"] for r in owner["runs"]}

        # Stopped, the first owns nothing: its state directory lists nothing.
        assert first.process.stop() == 0
        stopped = space.cli(first.process.data_dir, "runs", "--json")
        assert stopped.returncode == 0, stopped.stderr
        assert json.loads(stopped.stdout) == {"runs": [], "next_cursor": None, "partitions": []}
        assert "no processor runs" in stopped.stderr
    finally:
        sender.close()
        client.close()


def _submit_approvals(
    client: Client, partition: Callable[[str], int], partitions: int
) -> list[str]:
    """``RUNS_PER_PARTITION`` approval runs in each partition; their run ids."""
    per_partition: dict[int, int] = dict.fromkeys(range(partitions), 0)
    run_ids: list[str] = []
    while min(per_partition.values()) < RUNS_PER_PARTITION:
        command = new_submit("approval", {"n": len(run_ids)})
        if per_partition[partition(command.run_id)] < RUNS_PER_PARTITION:
            per_partition[partition(command.run_id)] += 1
            run_ids.append(command.run_id)
            client.send(command)
    client.flush()
    return run_ids


def _tokens(instance: Instance, runs: list[str]) -> dict[str, str] | None:
    """The resume token of each run, once every one waits at its await (else None)."""
    requests = instance.get(f"/api/requests?target={APPROVALS}")["requests"]
    tokens = {r["run_id"]: r["token"] for r in requests}
    return tokens if set(runs) <= tokens.keys() else None


def _status(client: Client, run_id: str) -> str | None:
    state = client.current(run_id).state
    return None if state is None else state.status
