"""Fixtures of the fault tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.apps.pipelines import app
from tests.apps.support import LoopHarness
from tests.faults.crash_env import crash_env  # noqa: F401  (a fixture of the crash tests)


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[LoopHarness]:
    """A processor loop on a fresh embedded log, driven by hand with a fake clock."""
    h = LoopHarness(tmp_path / "data", app)
    try:
        yield h
    finally:
        h.close()
