"""A processor loop with boundary pipelines, driven by hand, on each transport."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from processor.config.settings import Settings
from tests.apps.boundary_pipelines import app
from tests.apps.support import LoopHarness, transport_settings

SECRET = b"boundary-tests-secret-0123456789"


@pytest.fixture(params=["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    return transport_settings(request.param, tmp_path)


@pytest.fixture
def harness(settings: Settings) -> Iterator[LoopHarness]:
    h = LoopHarness.for_settings(settings, app, secret=SECRET)
    try:
        yield h
    finally:
        h.close()
