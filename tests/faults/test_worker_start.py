"""A worker started while the log cannot be reached (a broker restarting, its topics
not made yet) waits for it, then works; it does not crash its process."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from processor.clients.client import Client
from processor.config.settings import Settings
from processor.errors import TransportError
from processor.transport.base import GroupConsumer, Transport
from processor.transport.deployment import Deployment
from processor.worker.service import Worker
from tests.apps.pipelines import app
from tests.apps.support import ProcessorProcess, wait_until


class _UnreachableAtFirst:
    """``inner``, whose first ``failures`` group consumers cannot be made."""

    def __init__(self, inner: Transport, failures: int) -> None:
        self._inner = inner
        self.failures = failures

    def consumer(
        self, group: str, topics: Sequence[str], instance_id: str | None = None
    ) -> GroupConsumer:
        if self.failures > 0:
            self.failures -= 1
            raise TransportError("list topics: Failed to get metadata (broker down)")
        return self._inner.consumer(group, topics, instance_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_a_worker_that_cannot_join_yet_tries_again_and_then_works(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    processor = ProcessorProcess(data_dir, tmp_path / "processor.log", workers=0)
    processor.start()
    stop = threading.Event()
    try:
        processor.wait_running()
        deployment = Deployment.from_settings(Settings(data_dir=data_dir))
        transport = _UnreachableAtFirst(deployment.transport, failures=2)
        worker = Worker.from_settings(
            Deployment(deployment.settings, transport, deployment.topology),  # type: ignore[arg-type]
            app,
        )
        errors: list[BaseException] = []

        def run() -> None:
            try:
                worker.run(stop)
            except BaseException as exc:  # what the test asserts there is none of
                errors.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        with Client(settings=Settings(data_dir=data_dir)) as client:
            receipt = client.submit("steps3", {"n": 2}, wait_s=30)
            assert receipt.run_id is not None
            assert client.wait(receipt.run_id, timeout_s=60).status == "succeeded"
        assert transport.failures == 0 and errors == []
        stop.set()
        wait_until(lambda: not thread.is_alive(), 30.0, "the worker to stop")
    finally:
        stop.set()
        processor.close()
