"""Payload limits over HTTP and the CLI, against a real ``processor run`` (its own
workers) on each transport: 413 ``payload_too_large``, nothing produced or lost."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from processor.facts import payload
from processor.facts.topics import TopicName
from processor.transport.base import TopicPartition
from tests.apps.support import wait_until
from tests.web.support import Served, request_of, serve, status_of, submit

LIMIT = 4096
TRANSPORTS = ["embedded", pytest.param("kafka", marks=pytest.mark.kafka)]


@pytest.fixture(scope="module", params=TRANSPORTS)
def limited(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """A processor whose payload limit is ``LIMIT`` (set in its environment)."""
    path = tmp_path_factory.mktemp(f"limits-{request.param}")
    running = serve(request.param, path, env={"PROCESSOR_MAX_PAYLOAD_BYTES": str(LIMIT)})
    try:
        yield running
    finally:
        running.close()


def order(size: int) -> dict[str, Any]:
    """An order whose canonical JSON is exactly ``size`` bytes."""
    filler = size - len(payload.dumps({"amount": 5, "order_id": ""}))
    value = {"amount": 5, "order_id": "o" * filler}
    assert len(payload.dumps(value)) == size
    return value


def topic_end(served: Served, topic: TopicName = TopicName.COMMANDS) -> int:
    """Records ever committed to ``topic`` (all partitions)."""
    d = served.deployment
    reader = d.transport.reader()
    try:
        name = d.topology.name(topic)
        return sum(reader.end_offset(TopicPartition(name, p)) for p in range(d.topology.partitions))
    finally:
        reader.close()


def finished(http: httpx.Client, run_id: str) -> dict[str, Any]:
    return wait_until(
        lambda: (s := status_of(http, run_id))["status"] in ("succeeded", "failed") and s,
        90,
        f"run {run_id} to finish",
    )


def test_a_run_input_over_the_limit_is_413_and_nothing_is_produced(limited: Served) -> None:
    http = limited.http()
    before = topic_end(limited)
    answer = http.post("/api/runs", json={"pipeline": "orders", "input": order(LIMIT + 1)})
    assert answer.status_code == 413, answer.text
    assert answer.json() == {
        "error": "payload_too_large",
        "detail": f"run input is {LIMIT + 1} bytes, over the limit of {LIMIT} bytes",
    }
    assert topic_end(limited) == before


def test_a_step_output_over_the_limit_fails_the_run_with_payload_too_large(
    limited: Served,
) -> None:
    http = limited.http()
    # Accepted at the limit; ``validate`` makes the amount a float: two bytes more.
    run_id = submit(http, "orders", order(LIMIT))["run_id"]
    done = finished(http, run_id)
    assert done["status"] == "failed", done
    text = str(done)
    assert "PayloadTooLarge" in text and f"is {LIMIT + 2} bytes" in text, done


def test_a_completion_over_the_limit_is_413_and_the_run_goes_on(limited: Served) -> None:
    http = limited.http()
    run_id = submit(http, "orders", {"order_id": "lim-1", "amount": 5})["run_id"]
    request = wait_until(lambda: request_of(limited.deployment, run_id), 60, "the request")
    big = {"token": request.resume_token, "outcome": "succeeded", "output": "p" * LIMIT}
    answer = http.post("/api/completions", json=big)
    assert answer.status_code == 413, answer.text
    assert answer.json()["error"] == "payload_too_large"
    assert f"completion payload is {LIMIT + 2} bytes" in answer.json()["detail"]
    output = {"order_id": "lim-1", "amount": 6.0, "payment_id": "pay-1"}
    ok = {"token": request.resume_token, "outcome": "succeeded", "output": output}
    assert http.post("/api/completions", json=ok).status_code == 202
    assert finished(http, run_id)["status"] == "succeeded"  # the processor goes on


def test_the_cli_refuses_an_oversized_input_or_completion_first(limited: Served) -> None:
    data_dir = limited.process.data_dir
    env = limited.cli_env()  # the processor's own, PROCESSOR_MAX_PAYLOAD_BYTES included

    def processor(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "processor", "--data-dir", str(data_dir), *args]
        return subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=120, check=False
        )

    before = topic_end(limited)
    done = processor("submit", "orders", "--input", payload.dumps(order(LIMIT + 1)).decode())
    assert done.returncode == 2, done
    assert "payload_too_large" in done.stderr and f"limit of {LIMIT} bytes" in done.stderr
    assert topic_end(limited) == before

    run_id = submit(limited.http(), "orders", {"order_id": "cli-1", "amount": 5})["run_id"]
    request = wait_until(lambda: request_of(limited.deployment, run_id), 60, "the request")
    before = topic_end(limited, TopicName.COMPLETIONS)
    big = payload.dumps("c" * LIMIT).decode()
    done = processor("complete", request.resume_token, "--payload", big)
    assert done.returncode == 2, done
    assert f"completion payload is {LIMIT + 2} bytes" in done.stderr
    assert topic_end(limited, TopicName.COMPLETIONS) == before
