"""Fixtures of the whole-processor tests on a real Kafka broker."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.kafka.support import KafkaProcessorProcess, KafkaSpace
from tests.kafka_broker import kafka_bootstrap, unavailable_reason
from tests.schema_registry import schema_registry_url as find_schema_registry
from tests.schema_registry import unavailable_reason as registry_unavailable

ProcessFactory = Callable[..., KafkaProcessorProcess]


@pytest.fixture
def space() -> Iterator[KafkaSpace]:
    """A private topic prefix, groups and secret on the shared broker; deleted afterwards."""
    bootstrap = kafka_bootstrap()
    if bootstrap is None:
        pytest.skip(unavailable_reason())
    created = KafkaSpace.new(bootstrap)
    yield created
    created.delete_topics()


@pytest.fixture
def processes(space: KafkaSpace, tmp_path: Path) -> Iterator[ProcessFactory]:
    """Makes ``processor run`` processes, each with its own data dir and log; kills them after."""
    made: list[KafkaProcessorProcess] = []

    def make(name: str, workers: int = 2) -> KafkaProcessorProcess:
        process = space.process(tmp_path / name, tmp_path / f"{name}.log", workers=workers)
        made.append(process)
        return process

    try:
        yield make
    finally:
        for process in made:
            if process.proc is not None:
                process.resume()  # a paused process cannot exit cleanly
            process.close()


@pytest.fixture
def schema_registry_url() -> str:
    """A Confluent-compatible Schema Registry (SCHEMA_REGISTRY_URL or compose/local-registry).

    Skips without one, except under CI=true, where it fails.
    """
    url = find_schema_registry()
    if url is None:
        pytest.skip(registry_unavailable())
    return url
