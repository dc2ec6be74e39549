"""Schedules over HTTP and the command line, against a real ``processor run`` on the
embedded log: create, list, show, pause, resume, delete; 4xx with a reason for bad input.

The routes and commands are the client's
(``tests/schedules``), whose Kafka behaviour ``tests/kafka/test_schedules_on_kafka.py``
covers; a command line on Kafka costs about 10 s a call here."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.apps.support import wait_until
from tests.web.support import Served, serve

HOUR_S = 3600.0


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    running = serve("embedded", tmp_path_factory.mktemp("web-schedules"))
    try:
        yield running
    finally:
        running.close()


def _id() -> str:
    return f"api-{uuid.uuid4().hex[:8]}"


def _processor(served: Served, *args: str) -> subprocess.CompletedProcess[str]:
    """``processor ARGS`` against the served processor's log."""
    data_dir = served.process.data_dir
    return subprocess.run(
        [sys.executable, "-m", "processor", "--data-dir", str(data_dir), *args],
        env=served.cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_schedule_is_created_listed_paused_resumed_and_deleted_over_http(
    served: Served,
) -> None:
    http, sid = served.http(), _id()
    body = {"schedule_id": sid, "pipeline": "fulfil", "input": {"sku": "x"}, "interval_s": HOUR_S}
    created = http.post("/api/schedules", json=body)
    assert created.status_code == 201, created.text
    assert created.json() == {"schedule_id": sid, "changed": True}
    assert http.post("/api/schedules", json=body).status_code == 200  # the same again

    shown = http.get(f"/api/schedules/{sid}").json()
    assert shown["pipeline"] == "fulfil" and shown["input"] == {"sku": "x"}
    assert shown["paused"] is False and shown["last_fire_ms"] is None
    assert shown["next_fire_ms"] == shown["start_ms"] + HOUR_S * 1000
    assert sid in [s["schedule_id"] for s in http.get("/api/schedules").json()]

    paused = http.post(f"/api/schedules/{sid}/pause")
    assert paused.status_code == 200 and paused.json()["changed"] is True
    shown = http.get(f"/api/schedules/{sid}").json()
    assert shown["paused"] is True and shown["next_fire_ms"] is None
    assert http.post(f"/api/schedules/{sid}/resume").json()["changed"] is True
    assert http.get(f"/api/schedules/{sid}").json()["paused"] is False

    assert http.post(f"/api/schedules/{sid}/delete").status_code == 200
    assert http.get(f"/api/schedules/{sid}").status_code == 404
    gone = http.post(f"/api/schedules/{sid}/pause")
    assert gone.status_code == 404 and gone.json()["error"] == "unknown_schedule"


@pytest.mark.parametrize(
    ("changes", "status", "error"),
    [
        ({"pipeline": "no_such_pipeline"}, 422, "unknown_pipeline"),
        ({"cron": "0 25 * * *", "interval_s": None}, 422, "bad_cron"),
        (
            {"cron": "0 9 * * *", "interval_s": None, "timezone": "Mars/Olympus"},
            422,
            "unknown_time_zone",
        ),
        ({"overlap": "sometimes"}, 422, "bad_policy"),
        ({"schedule_id": "no spaces"}, 422, "bad_schedule_id"),
    ],
)
def test_a_bad_schedule_gets_a_4xx_with_its_reason(
    served: Served, changes: dict[str, Any], status: int, error: str
) -> None:
    body = {"schedule_id": _id(), "pipeline": "fulfil", "input": 1, "interval_s": HOUR_S}
    refused = served.http().post("/api/schedules", json={**body, **changes})
    assert refused.status_code == status, refused.text
    assert refused.json()["error"] == error and refused.json()["detail"]


def test_schedules_from_the_command_line(served: Served) -> None:
    sid = _id()
    created = _processor(
        served, "schedule", "create", sid, "--pipeline", "fulfil", "--input", '{"sku": "c"}',
        "--cron", "30 6 * * 1-5", "--tz", "Europe/Berlin", "--overlap", "skip", "--json",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout) == {"schedule_id": sid, "changed": True}

    listed = _processor(served, "schedule", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    mine = [s for s in json.loads(listed.stdout) if s["schedule_id"] == sid]
    assert len(mine) == 1 and mine[0]["timezone"] == "Europe/Berlin"
    assert mine[0]["overlap"] == "skip" and mine[0]["next_fire_ms"] is not None
    text = _processor(served, "schedule", "list")
    assert sid in text.stdout and "Europe/Berlin" in text.stdout and "next " in text.stdout

    for action, done in (("pause", "paused"), ("resume", "resumed"), ("delete", "deleted")):
        answered = _processor(served, "schedule", action, sid)
        assert answered.returncode == 0, answered.stderr
        assert answered.stdout.strip() == f"{sid} {done}"
    wait_until(lambda: sid not in _processor(served, "schedule", "list").stdout, 30, "the deletion")


@pytest.mark.parametrize(
    ("args", "code", "reason"),
    [
        (["--pipeline", "fulfil", "--cron", "not a cron"], 2, "bad_cron"),
        (
            ["--pipeline", "fulfil", "--cron", "0 9 * * *", "--tz", "Nowhere/Else"],
            2,
            "unknown_time_zone",
        ),
        (["--pipeline", "no_such_pipeline", "--every", "60"], 1, "unknown_pipeline"),
    ],
)
def test_the_command_line_refuses_a_bad_schedule_with_its_reason(
    served: Served, args: list[str], code: int, reason: str
) -> None:
    refused = _processor(served, "schedule", "create", _id(), *args, "--json")
    assert refused.returncode == code, refused.stderr
    assert json.loads(refused.stderr)["refusal"] == reason
