"""A processor loop with the run-control pipelines, driven by hand, on each transport."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from processor.settings import Settings
from tests.apps.control_pipelines import app
from tests.apps.support import FakeClock, LoopHarness
from tests.control.control_support import Control

SECRET = b"control-tests-secret-0123456789"


def _settings(kind: str, tmp_path: Path) -> Settings:
    if kind == "embedded":
        return Settings(data_dir=tmp_path / "data")
    from tests.kafka_broker import kafka_bootstrap, unavailable_reason

    bootstrap = kafka_bootstrap()
    if bootstrap is None:
        pytest.skip(unavailable_reason())
    return Settings(
        broker=f"kafka://{bootstrap}",
        data_dir=tmp_path / "data",
        topic_prefix=f"t{uuid.uuid4().hex[:10]}.",
        group=f"g{uuid.uuid4().hex[:10]}",
        partitions=2,
    )


@pytest.fixture(params=["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    return _settings(request.param, tmp_path)


@pytest.fixture
def start(settings: Settings) -> Iterator[Callable[[Control | None], Control]]:
    """Start a harness on ``settings``; given the previous Control, restart after closing it.

    A restarted harness keeps the fake clock and the work items already seen.
    """
    opened: list[Control] = []

    def start_(previous: Control | None = None) -> Control:
        clock = FakeClock()
        if previous is not None:
            previous.close()
            clock = previous.h.clock
        h = LoopHarness(settings.data_dir, app, clock, settings=settings, secret=SECRET)
        control = Control(h, previous)
        opened.append(control)
        return control

    try:
        yield start_
    finally:
        for control in opened:
            control.close()


@pytest.fixture
def ctl(start: Callable[[Control | None], Control]) -> Control:
    return start(None)
