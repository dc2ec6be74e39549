"""A processor loop with the sleep pipelines, driven by hand, on each transport
(as tests/control's: one loop per module, or one of a test's own with ``start``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.apps.sleep_pipelines import app
from tests.apps.support import FakeClock, LoopHarness
from tests.control.conftest import SECRET, _settings
from tests.control.control_support import Control


@pytest.fixture(scope="module", params=["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def shared(transport: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopHarness]:
    settings = _settings(transport, tmp_path_factory.mktemp("sleep"))
    h = LoopHarness(settings.data_dir, app, FakeClock(), settings=settings, secret=SECRET)
    try:
        yield h
    finally:
        h.close()


@pytest.fixture
def ctl(shared: LoopHarness) -> Control:
    return Control(shared)


@pytest.fixture
def start(transport: str, tmp_path: Path) -> Iterator[Callable[[Control | None], Control]]:
    """Start a loop of its own on fresh topics; given the previous Control, restart it
    (same data dir, topics, group and fake clock)."""
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
