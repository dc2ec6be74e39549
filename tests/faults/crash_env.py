"""A ``processor run`` child process on either transport, for the kill -9 tests, and
``processor worker`` processes beside it (``CrashEnv.spawn``)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from processor.config.settings import Settings
from processor.transport.deployment import Deployment
from tests.apps.support import ProcessorProcess, cli

if TYPE_CHECKING:
    from tests.kafka.support import KafkaSpace

__all__ = ["CrashEnv", "crash_env"]


@dataclass
class CrashEnv:
    """The process under test, a client deployment of the same log, and the CLI."""

    process: ProcessorProcess
    deployment: Deployment
    transport: str
    _space: KafkaSpace | None = None
    _spawned: list[ProcessorProcess] = field(default_factory=list)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        if self._space is None:
            return cli(self.process.data_dir, *args)
        return self._space.cli(self.process.data_dir, *args)

    def spawn(self, name: str, *, app: str, command: str = "worker") -> ProcessorProcess:
        """Another process (not started) on the same log, or in the same Kafka space, with
        the same data directory as ``process``; its log is ``<name>.log`` beside its own.
        The fixture kills it at the end of the test if it still runs."""
        log = self.process.log_path.with_name(f"{name}.log")
        data_dir = self.process.data_dir
        if self._space is None:
            spawned = ProcessorProcess(data_dir, log, app=app, workers=1, command=command)
        else:
            from tests.kafka.support import KafkaProcessorProcess

            spawned = KafkaProcessorProcess(self._space, data_dir, log, workers=1, command=command)
            spawned.app = app
        self._spawned.append(spawned)
        return spawned

    def close(self) -> None:
        """Kill what still runs (test teardown)."""
        for process in [*self._spawned, self.process]:
            process.close()


@pytest.fixture(params=["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def crash_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CrashEnv]:
    """The control pipelines' processor on the embedded log, then on a real broker."""
    data_dir, log = tmp_path / "data", tmp_path / "processor.log"
    app = "tests.apps.control_pipelines:app"
    if request.param == "embedded":
        process = ProcessorProcess(data_dir, log, app=app, workers=2)
        env = CrashEnv(process, Deployment.from_settings(Settings(data_dir=data_dir)), "embedded")
        try:
            yield env
        finally:
            env.close()
        return
    from tests.kafka.support import KafkaProcessorProcess, KafkaSpace
    from tests.kafka_broker import kafka_bootstrap, unavailable_reason

    bootstrap = kafka_bootstrap()
    if bootstrap is None:
        pytest.skip(unavailable_reason())
    space = KafkaSpace.new(bootstrap)
    kafka_process = KafkaProcessorProcess(space, data_dir, log, workers=2)
    kafka_process.app = app
    env = CrashEnv(kafka_process, space.deployment(tmp_path / "client"), "kafka", space)
    try:
        yield env
    finally:
        env.close()
        space.delete_topics()
