"""A processor loop with the sleep pipelines, driven by hand, on each transport
(as tests/control's: one loop per module, or one of a test's own with ``start``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.apps.sleep_pipelines import app
from tests.apps.support import LoopHarness
from tests.control.conftest import ctl, transport
from tests.control.control_support import StartLoop, own_loops, shared_loop

__all__ = ["ctl", "shared", "start", "transport"]  # the fixtures of tests/sleep


@pytest.fixture(scope="module")
def shared(transport: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopHarness]:
    yield from shared_loop(app, transport, tmp_path_factory.mktemp("sleep"))


@pytest.fixture
def start(transport: str, tmp_path: Path) -> Iterator[StartLoop]:
    yield from own_loops(app, transport, tmp_path)
