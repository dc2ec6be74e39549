"""Fixtures of the HTTP tests: a real ``processor run`` on each transport."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.web.support import Served, serve

TRANSPORTS = ["embedded", pytest.param("kafka", marks=pytest.mark.kafka)]


@pytest.fixture(scope="module", params=TRANSPORTS)
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """One processor per module and transport, shared by the module's tests."""
    running = serve(request.param, tmp_path_factory.mktemp(f"web-{request.param}"))
    try:
        yield running
    finally:
        running.close()


@pytest.fixture(params=TRANSPORTS)
def fresh(request: pytest.FixtureRequest, tmp_path: object) -> Iterator[Served]:
    """A processor of the test's own (its metrics start at zero)."""
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    running = serve(request.param, tmp_path)
    try:
        yield running
    finally:
        running.close()
