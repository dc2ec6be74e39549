"""Fixtures of the transport conformance suite: one ``transport`` per implementation.

Each test gets a fresh log (embedded) and creates its own uniquely named topics
through ``transport.admin()``, so the suite also runs against a shared broker.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from processor.transport.base import TopicSpec, Transport

TopicFactory = Callable[..., str]


def _embedded(tmp_path: Path) -> Transport:
    from processor.transport.embedded import EmbeddedTransport

    return EmbeddedTransport(tmp_path / "log")


def _kafka(tmp_path: Path) -> Transport:
    from processor.config.settings import Settings
    from processor.transport.kafka import KafkaTransport
    from tests.kafka_broker import kafka_bootstrap, unavailable_reason

    bootstrap = kafka_bootstrap()
    if bootstrap is None:
        pytest.skip(unavailable_reason())
    settings = Settings(broker=f"kafka://{bootstrap}", data_dir=tmp_path / "data")
    # A zombie (a session that stopped polling) is evicted from its group after
    # max.poll.interval.ms; keep that short so a successor takes over within a test.
    return KafkaTransport(settings, session_timeout_ms=6_000, max_poll_interval_ms=6_000)


_FACTORIES: dict[str, Callable[[Path], Transport]] = {"embedded": _embedded, "kafka": _kafka}


@pytest.fixture(params=["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def transport(request: pytest.FixtureRequest, tmp_path: Path) -> Transport:
    """The transport under test."""
    return _FACTORIES[request.param](tmp_path)


@pytest.fixture
def closing() -> Iterator[Callable[[Any], Any]]:
    """Register a client to be closed at teardown; returns the client."""
    clients: list[Any] = []

    def register(client: Any) -> Any:
        clients.append(client)
        return client

    yield register
    for client in reversed(clients):
        client.close()


@pytest.fixture
def make_topic(transport: Transport) -> TopicFactory:
    """Create a topic with a unique name and wait until the transport describes it."""

    def make(partitions: int = 4, prefix: str = "conformance", **config: str) -> str:
        name = f"{prefix}.{uuid.uuid4().hex[:12]}"
        admin = transport.admin()
        try:
            assert admin.create_topics([TopicSpec(name, partitions, config)]) == [name]
            deadline = time.monotonic() + 30.0
            while name not in admin.describe_topics():
                assert time.monotonic() < deadline, f"topic {name} never appeared"
                time.sleep(0.05)
        finally:
            admin.close()
        return name

    return make
