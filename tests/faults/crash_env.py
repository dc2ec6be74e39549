"""A ``processor run`` child process on either transport, for the kill -9 tests."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from processor.config.settings import Settings
from processor.transport.deployment import Deployment
from tests.apps.support import ProcessorProcess, cli

__all__ = ["CrashEnv", "crash_env"]


@dataclass
class CrashEnv:
    """The process under test, a client deployment of the same log, and the CLI."""

    process: ProcessorProcess
    deployment: Deployment
    transport: str
    _space: object | None = None

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        if self._space is None:
            return cli(self.process.data_dir, *args)
        return self._space.cli(self.process.data_dir, *args)  # type: ignore[attr-defined]


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
            process.close()
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
        kafka_process.close()
        space.delete_topics()
