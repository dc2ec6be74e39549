"""A processor loop with boundary pipelines, driven by hand, on each transport."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from processor.config.settings import Settings
from tests.apps.boundary_pipelines import app
from tests.apps.support import LoopHarness

SECRET = b"boundary-tests-secret-0123456789"


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
def harness(settings: Settings) -> Iterator[LoopHarness]:
    h = LoopHarness.for_settings(settings, app, secret=SECRET)
    try:
        yield h
    finally:
        h.close()
