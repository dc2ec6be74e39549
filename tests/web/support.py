"""A ``processor run`` serving HTTP, on either transport, and helpers to talk to it."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from processor.config.settings import Settings
from processor.facts.codec import codec
from processor.facts.models import BoundaryRequest
from processor.facts.topics import TopicName
from processor.transport.base import TopicPartition
from processor.transport.deployment import Deployment
from tests.apps.support import ProcessorProcess, subprocess_env, wait_until

APP = "tests.apps.web_pipelines:app"
TOKEN = "test-token-" + uuid.uuid4().hex[:8]


@dataclass
class Served:
    """A processor process, its HTTP address, and a client-side deployment of its log."""

    process: ProcessorProcess
    deployment: Deployment
    transport: str
    url: str = ""
    _space: Any = None
    _clients: list[httpx.Client] = field(default_factory=list)

    def http(self, token: str | None = TOKEN) -> httpx.Client:
        """An HTTP client of the server (with the bearer token, unless None)."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        client = httpx.Client(base_url=self.url, headers=headers, timeout=60)
        self._clients.append(client)
        return client

    def cli_env(self) -> dict[str, str]:
        """The environment of a ``processor`` command against this processor's log."""
        data_dir = self.process.data_dir
        base = subprocess_env(data_dir) if self._space is None else self._space.env(data_dir)
        return {**base, **self.process.extra_env}

    def close(self) -> None:
        for client in self._clients:
            client.close()
        self.process.close()
        if self._space is not None:
            self._space.delete_topics()


def serve(
    transport: str,
    tmp_path: Path,
    *,
    workers: int = 2,
    env: dict[str, str] | None = None,
    app: str = APP,
) -> Served:
    """Start ``processor run`` on ``transport`` with HTTP on a free port and the test token
    (and the settings ``env`` adds, ``PROCESSOR_*`` variables)."""
    data_dir, log = tmp_path / "data", tmp_path / "processor.log"
    env = {"PROCESSOR_HTTP_TOKEN": TOKEN, **(env or {})}
    if transport == "embedded":
        process = ProcessorProcess(data_dir, log, app=app, workers=workers)
        served = Served(process, Deployment.from_settings(Settings(data_dir=data_dir)), transport)
    else:
        from tests.kafka.support import KafkaProcessorProcess, KafkaSpace
        from tests.kafka_broker import kafka_bootstrap, unavailable_reason

        bootstrap = kafka_bootstrap()
        if bootstrap is None:
            pytest.skip(unavailable_reason())
        space = KafkaSpace.new(bootstrap)
        process = KafkaProcessorProcess(space, data_dir, log, workers=workers)
        process.app = app
        deployment = space.deployment(tmp_path / "client")
        served = Served(process, deployment, transport, _space=space)
    process.extra_env = env
    process.start()
    try:
        served.url = wait_until(process.http_address, 120, "the HTTP address")
        wait_until(lambda: _ready(served.url), 120, "the processor to be ready")
    except BaseException:
        served.close()
        raise
    return served


@contextmanager
def serving(transport: str, tmp_path: Path) -> Iterator[Served]:
    served = serve(transport, tmp_path)
    try:
        yield served
    finally:
        served.close()


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def metrics(client: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics, by (name, sorted labels)."""
    answer = client.get("/metrics")
    assert answer.status_code == 200, answer.text
    samples = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def sample(
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    """One sample's value (0 when the series does not exist yet)."""
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


def series(
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str
) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample of one name, by labels."""
    return {labels: value for (n, labels), value in found.items() if n == name}


def submit(client: httpx.Client, pipeline: str, value: Any, **extra: Any) -> dict[str, Any]:
    answer = client.post("/api/runs", json={"pipeline": pipeline, "input": value, **extra})
    assert answer.status_code in (200, 201), answer.text
    body: dict[str, Any] = answer.json()
    return body


def request_of(deployment: Deployment, run_id: str) -> BoundaryRequest | None:
    """The run's boundary request, read from boundary.requests (None: not sent yet)."""
    topic = deployment.topology.name(TopicName.REQUESTS)
    reader = deployment.transport.reader()
    try:
        for partition in range(deployment.topology.partitions):
            for records in reader.read(TopicPartition(topic, partition), 0):
                for record in records:
                    request = codec().decode_as(record.value, BoundaryRequest)
                    if request.run_id == run_id:
                        return request
    finally:
        reader.close()
    return None


def status_of(client: httpx.Client, run_id: str) -> dict[str, Any]:
    answer = client.get(f"/api/runs/{run_id}")
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


#: The addresses a page loads: its src and href attributes, and Swagger UI's ``url``.
_PAGE_URLS = re.compile(r"""(?:\b(?:src|href)\s*=\s*|\burl:\s*)["']([^"']+)["']""")


def assert_docs_offline(get: Callable[[str], httpx.Response]) -> list[str]:
    """/docs names no other host and every file it loads is served here: a machine
    without Internet access shows it. Returns the addresses it loads."""
    page = get("/docs")
    assert page.status_code == 200, page.text
    assert "://" not in page.text, page.text  # no CDN, no other host
    loaded = _PAGE_URLS.findall(page.text)
    assert {u.rsplit("/", 1)[-1] for u in loaded} >= {
        "swagger-ui-bundle.js",
        "swagger-ui.css",
        "openapi.json",
    }, loaded
    for url in loaded:
        assert url.startswith("/") and not url.startswith("//"), url
        answer = get(url)
        assert answer.status_code == 200, (url, answer.status_code)
        assert answer.content, url
    return loaded
