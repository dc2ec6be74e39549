"""Events sent over HTTP (POST /api/events) and with ``processor signal`` reach the
waiting run through the admission stage, on both transports; bad bodies get a 4xx with
a reason; status shows what the run waits for."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.apps.support import wait_until
from tests.web.support import Served, serve, status_of, submit

APP = "tests.apps.event_pipelines:app"


# Embedded only: the route and the command are the client's (Client.signal), and the
# admission of events on Kafka is tested in tests/boundaries/test_event_waits.py (a served
# Kafka processor would add over a minute to the CI run for no other path).
@pytest.fixture(scope="module", params=["embedded"])
def events_served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    running = serve(request.param, tmp_path_factory.mktemp(f"events-{request.param}"), app=APP)
    try:
        yield running
    finally:
        running.close()


def _waiting_for(http: httpx.Client, run_id: str) -> dict[str, Any] | None:
    waiting = status_of(http, run_id).get("waiting")
    return waiting if waiting and "event" in waiting else None


def _done(http: httpx.Client, run_id: str) -> dict[str, Any] | None:
    shown = status_of(http, run_id)
    return shown if shown["status"] == "succeeded" else None


def test_a_posted_event_resumes_the_run_that_waits_for_it(events_served: Served) -> None:
    http = events_served.http()
    order = {"order": f"o-{uuid.uuid4().hex[:8]}", "region": "eu"}
    run_id = submit(http, "paid", order)["run_id"]
    waiting = wait_until(lambda: _waiting_for(http, run_id), 60, "the run waits for its event")
    assert waiting["kind"] == "event"
    assert waiting["event"]["name"] == "payment_received"
    assert waiting["event"]["correlation"] == order
    assert waiting["event"]["key"] == order["order"]
    assert waiting["event"]["deadline_ms"] == waiting["next_deadline_ms"]
    body = {"name": "payment_received", "key": order["order"], "correlation": {"region": "eu"}}
    answer = http.post("/api/events", json={**body, "payload": {"amount": 3}})
    assert answer.status_code == 202, answer.text
    assert answer.json()["name"] == "payment_received" and answer.json()["event_id"]
    done = wait_until(lambda: _done(http, run_id), 60, "the run done")
    assert done["result"] == {"shipped": {"amount": 3}}


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        ({"run_id": "r", "payload": 1}, 422, None),  # no name
        ({"name": "poke", "payload": 1}, 422, "invalid_request"),  # no address
        ({"name": "poke", "run_id": "r", "key": "k"}, 422, "invalid_request"),  # both
        ({"name": "poke", "run_id": "r", "correlation": {"n": 1}}, 422, None),
        ({"name": "poke", "run_id": "r", "colour": "red"}, 422, None),
        ({"name": "", "run_id": "r"}, 422, None),
        ({"name": "poke", "run_id": "r", "payload": "x" * 2_000_000}, 413, "payload_too_large"),
    ],
)
def test_a_bad_event_body_gets_a_4xx_with_a_reason(
    events_served: Served, body: dict[str, Any], status: int, error: str | None
) -> None:
    answer = events_served.http().post("/api/events", json=body)
    assert answer.status_code == status, answer.text
    if error is not None:
        assert answer.json()["error"] == error and answer.json()["detail"]


def test_processor_signal_resumes_a_run_and_refuses_bad_arguments(events_served: Served) -> None:
    http = events_served.http()
    run_id = submit(http, "poked", {"n": 1})["run_id"]
    wait_until(lambda: _waiting_for(http, run_id), 60, "the run waits for its event")
    args = ("signal", "poke", "--run", run_id, "--payload", '{"x": 1}', "--event-id", "e-1")
    sent = _processor(events_served, "--json", *args)
    assert sent.returncode == 0, sent.stderr
    assert json.loads(sent.stdout)["event_id"] == "e-1"
    done = wait_until(lambda: _done(http, run_id), 60, "the run done")
    assert done["result"] == {"poked": {"x": 1}}
    both = _processor(events_served, "signal", "poke", "--run", run_id, "--key", "k")
    assert both.returncode != 0 and "exactly one" in both.stderr
    bad_field = _processor(events_served, "signal", "poke", "--run", run_id, "--field", "nope")
    assert bad_field.returncode != 0 and "FIELD=VALUE" in bad_field.stderr


def _processor(served: Served, *args: str) -> subprocess.CompletedProcess[str]:
    data_dir = served.process.data_dir
    return subprocess.run(
        [sys.executable, "-m", "processor", "--data-dir", str(data_dir), *args],
        env=served.cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_replay_verify_agrees_with_the_live_index_of_waiting_runs(events_served: Served) -> None:
    http = events_served.http()
    run_id = submit(http, "paid", {"order": f"o-{uuid.uuid4().hex[:8]}", "region": "eu"})["run_id"]
    wait_until(lambda: _waiting_for(http, run_id), 60, "the run waits by key")
    verify = _processor(events_served, "replay", "--verify", "--json")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    report = json.loads(verify.stdout)
    assert report["verified"] is True, report["differences"]
