"""A processor loop with the run-control pipelines, driven by hand, on each transport.

One loop per transport serves every test of a module (each test uses its own
runs and only relative times on the shared fake clock): creating topics and
joining a group costs seconds on Kafka. Tests that restart the processor start
their own loops on fresh topics with ``start``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.apps.control_pipelines import app
from tests.apps.support import LoopHarness
from tests.control.control_support import Control, StartLoop, own_loops, shared_loop


@pytest.fixture(scope="module", params=["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def shared(transport: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopHarness]:
    yield from shared_loop(app, transport, tmp_path_factory.mktemp("control"))


@pytest.fixture
def ctl(shared: LoopHarness) -> Control:
    """The module's loop, with views that start at the current ends of the topics."""
    return Control(shared)


@pytest.fixture
def start(transport: str, tmp_path: Path) -> Iterator[StartLoop]:
    """Start a loop of its own on fresh topics; given the previous Control, restart it."""
    yield from own_loops(app, transport, tmp_path)
