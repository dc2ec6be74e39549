"""A processor loop with the run-control pipelines, driven by hand, on each transport.

One loop per transport serves every test of a module (each test uses its own
runs and only relative times on the shared fake clock): creating topics and
joining a group costs seconds on Kafka. Tests that restart the processor start
their own loops on fresh topics with ``start``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from processor.config.settings import Settings
from tests.apps.control_pipelines import app
from tests.apps.support import FakeClock, LoopHarness
from tests.control.control_support import Control

SECRET = b"control-tests-secret-0123456789"


def _settings(kind: str, path: Path) -> Settings:
    if kind == "embedded":
        return Settings(data_dir=path / "data")
    from tests.kafka_broker import kafka_bootstrap, unavailable_reason

    bootstrap = kafka_bootstrap()
    if bootstrap is None:
        pytest.skip(unavailable_reason())
    return Settings(
        broker=f"kafka://{bootstrap}",
        data_dir=path / "data",
        topic_prefix=f"t{uuid.uuid4().hex[:10]}.",
        group=f"g{uuid.uuid4().hex[:10]}",
        partitions=2,
    )


@pytest.fixture(scope="module", params=["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def shared(transport: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopHarness]:
    settings = _settings(transport, tmp_path_factory.mktemp("control"))
    h = LoopHarness(settings.data_dir, app, FakeClock(), settings=settings, secret=SECRET)
    try:
        yield h
    finally:
        h.close()


@pytest.fixture
def ctl(shared: LoopHarness) -> Control:
    """The module's loop, with views that start at the current ends of the topics."""
    return Control(shared)


@pytest.fixture
def start(transport: str, tmp_path: Path) -> Iterator[Callable[[Control | None], Control]]:
    """Start a loop of its own on fresh topics; given the previous Control, restart it.

    A restarted loop (closed, then opened on the same data dir, topics and group)
    keeps the fake clock and the work items already dispatched.
    """
    settings = _settings(transport, tmp_path)
    opened: list[Control] = []

    def start_(previous: Control | None = None) -> Control:
        clock = FakeClock()
        if previous is not None:
            previous.close()
            clock = previous.h.clock
        h = LoopHarness(settings.data_dir, app, clock, settings=settings, secret=SECRET)
        control = Control(h, previous, owned=True)
        opened.append(control)
        return control

    try:
        yield start_
    finally:
        for control in opened:
            control.close()
