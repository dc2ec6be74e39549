"""/readyz is not ready while a lost store is being restored, and ready afterwards.

A Host in-process (both transports) loses every partition store between two starts;
the restore of the second start is held at its first catch-up, so the test can look
at /readyz while it is under way, then let it finish.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import processor.restore.assignment as assignment_module
from processor.clients.client import Client
from processor.config.settings import Settings
from processor.engine.host import Host
from processor.store.rocks import PartitionStore, store_path
from processor.transport.deployment import Deployment, ensure_topics
from processor.web.wiring import ProcessorWeb
from tests.apps.support import wait_until
from tests.apps.web_pipelines import app
from tests.web.support import metrics, sample

RUNS = 6


@pytest.fixture(params=["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def deployment(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Deployment]:
    if request.param == "embedded":
        yield Deployment.from_settings(Settings(data_dir=tmp_path / "data"))
        return
    from tests.kafka.support import KafkaSpace
    from tests.kafka_broker import kafka_bootstrap, unavailable_reason

    bootstrap = kafka_bootstrap()
    if bootstrap is None:
        pytest.skip(unavailable_reason())
    space = KafkaSpace.new(bootstrap)
    try:
        yield space.deployment(tmp_path / "data")
    finally:
        space.delete_topics()


class HeldRestore:
    """Holds the loop's first catch-up of an empty store until ``release``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reached = threading.Event()
        self._released = threading.Event()
        real = assignment_module.catch_up

        def held(store: PartitionStore, *args: Any, **kwargs: Any) -> Any:
            if store.facts_offset() == 0:
                self.reached.set()
                assert self._released.wait(120), "the test never released the restore"
            return real(store, *args, **kwargs)

        monkeypatch.setattr(assignment_module, "catch_up", held)

    def release(self) -> None:
        self._released.set()


def _first_runs(deployment: Deployment) -> list[str]:
    """Runs of a first start, ended (each fails at once), so every store holds facts."""
    ensure_topics(deployment, app.output_topics)
    host = Host(deployment, app, workers=1)
    host.start()
    d = deployment
    try:
        with Client(d.transport, d.topology, d.settings.state_dir) as client:
            run_ids = [client.submit("non_retryable", i).run_id for i in range(RUNS)]
            for run_id in run_ids:
                assert client.wait(run_id, 60).status == "failed"
    finally:
        host.stop()
    return run_ids


def test_not_ready_while_a_lost_store_is_restored(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_ids = _first_runs(deployment)
    state_dir = deployment.settings.state_dir
    for partition in range(deployment.topology.partitions):
        shutil.rmtree(store_path(state_dir, partition))  # every store lost
    held = HeldRestore(monkeypatch)
    host = Host(deployment, app, workers=1)
    host.start()
    web = ProcessorWeb(host, port=0)
    http = httpx.Client(base_url=web.start(), timeout=30)
    try:
        assert held.reached.wait(120), "the restore did not start"
        answer = http.get("/readyz")
        assert answer.status_code == 503, answer.text
        assert answer.json()["ready"] is False
        assert "restoring" in answer.json()["reason"]
        assert sample(metrics(http), "processor_partitions_restoring") >= 1
        held.release()

        def ready() -> dict[str, Any]:
            found = http.get("/readyz")
            return found.json() if found.status_code == 200 else {}

        shown = wait_until(ready, 120, "ready after the restore")
        assert shown == {
            "ready": True,
            "partitions": [0, 1, 2, 3],
            "quarantined": [],
            "skipped": [],
        }
        assert sample(metrics(http), "processor_partitions_restoring") == 0
        assert sample(metrics(http), "processor_restore_facts_total") > 0
        for run_id in run_ids:  # the rebuilt stores know the runs of before
            assert http.get(f"/api/runs/{run_id}").json()["status"] == "failed"
    finally:
        held.release()
        http.close()
        web.stop()
        host.stop()
