"""``PROCESSOR_LOG_FORMAT=json``: one JSON object per line, run fields on records about a run.

Runs that succeed, retry and fail go through a processor and its workers with the
JSON formatter on the root logger; every line must parse, and every record about
one of the runs must carry its run id, pipeline, step and attempt. The CLI gives
the same lines on stderr with the setting, and refuses a format it does not know.
"""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from processor.clients.client import Client, new_submit
from processor.config.settings import Settings
from processor.engine.host import Host
from processor.telemetry.logs import (
    RUN_FIELDS,
    JsonFormatter,
    configure_logging,
    run_context,
    run_extra,
)
from processor.transport.deployment import Deployment
from tests.apps.pipelines import app
from tests.apps.support import REPO_ROOT, subprocess_env, wait_until

RUN_ID = "a2b5c9e0-0000-4000-8000-000000000001"


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """Every record at INFO and above, formatted by the JSON formatter."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield out
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def _lines(out: io.StringIO) -> list[dict[str, Any]]:
    lines = out.getvalue().splitlines()
    assert lines, "nothing was logged"
    return [json.loads(line) for line in lines]  # every line is one JSON object


def test_a_record_has_the_fields_and_the_run_of_its_context(captured: io.StringIO) -> None:
    log = logging.getLogger("processor.test")
    log.info("outside any run")
    with run_context(RUN_ID, "orders", 2, 3):
        log.warning("about %s", "the run")
    log.info("one call about a run", extra=run_extra(RUN_ID, "orders", attempt=1))
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("failed")
    outside, inside, extra, failed = _lines(captured)
    assert set(outside) == {"time", "level", "logger", "message"}
    assert (outside["level"], outside["logger"]) == ("INFO", "processor.test")
    assert outside["time"].endswith("+00:00")
    assert inside["message"] == "about the run"
    assert {k: inside[k] for k in RUN_FIELDS} == {
        "run_id": RUN_ID,
        "pipeline": "orders",
        "step": 2,
        "attempt": 3,
    }
    assert {k: extra[k] for k in RUN_FIELDS} == {
        "run_id": RUN_ID,
        "pipeline": "orders",
        "step": None,
        "attempt": 1,
    }
    assert "RuntimeError: boom" in failed["exception"] and "run_id" not in failed


def test_configure_logging_refuses_an_unknown_format() -> None:
    with pytest.raises(ValueError, match="text, json"):
        configure_logging("yaml")  # type: ignore[arg-type]


@pytest.mark.parametrize("inline", [False, True], ids=["workers", "inline"])
def test_records_about_runs_carry_the_run_fields(
    tmp_path: Path, captured: io.StringIO, inline: bool
) -> None:
    """Also when the processor runs the steps itself (PROCESSOR_INLINE_STEPS)."""
    settings = Settings(data_dir=tmp_path / "data", inline_steps=inline)
    deployment = Deployment.from_settings(settings)
    host = Host(deployment, app, workers=2)
    host.start()
    client = Client(deployment.transport, deployment.topology, deployment.settings.state_dir)
    commands = [
        new_submit("flaky", {"key": f"logs-{uuid.uuid4()}", "fail_times": 1}),
        new_submit("always_fails", {"x": 1}),
        new_submit("non_retryable", {"x": 2}),
        new_submit("steps3", {"n": 3}),
    ]
    pipelines = {command.run_id: command.pipeline for command in commands}
    try:
        for command in commands:
            client.send(command)
        client.flush()

        def finished() -> list[dict[str, Any]]:
            ends = [r for r in _lines(captured) if r["message"].startswith("run ")]
            return ends if {r.get("run_id") for r in ends} >= pipelines.keys() else []

        wait_until(finished, 60, "a log record of each finished run")
        assert not host.errors
    finally:
        host.stop()
        client.close()
    records = _lines(captured)
    about_runs = [r for r in records if any(run_id in r["message"] for run_id in pipelines)]
    # finished runs (4), the failed steps (1 + 2 + 1), at least
    assert len(about_runs) >= 8
    for record in about_runs:
        assert all(field in record for field in RUN_FIELDS), record
        assert record["run_id"] in record["message"], record
        assert record["pipeline"] == pipelines[record["run_id"]], record
    failed_steps = [r for r in about_runs if " failed: " in r["message"]]
    assert {(r["pipeline"], r["step"], r["attempt"]) for r in failed_steps} >= {
        ("flaky", 1, 1),
        ("always_fails", 1, 1),
        ("always_fails", 1, 2),
        ("non_retryable", 0, 1),
    }


def _cli(data_dir: Path, log_format: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m processor --data-dir D ARGS`` with ``PROCESSOR_LOG_FORMAT``."""
    env = {**subprocess_env(data_dir), "PROCESSOR_LOG_FORMAT": log_format}
    return subprocess.run(
        [sys.executable, "-m", "processor", "--data-dir", str(data_dir), *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_cli_logs_json_lines_with_the_setting(tmp_path: Path) -> None:
    done = _cli(tmp_path / "data", "json", "-v", "demo", "--runs", "5", "--workers", "1")
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stderr.splitlines()]
    finished = [r for r in records if r["logger"] == "processor.engine.loop" and "run_id" in r]
    assert len(finished) == 5
    assert all(r["pipeline"] == "orders" and r["attempt"] == 1 for r in finished)


def test_the_cli_refuses_an_unknown_log_format(tmp_path: Path) -> None:
    done = _cli(tmp_path / "data", "xml", "topics", "list")
    assert done.returncode == 2
    assert "PROCESSOR_LOG_FORMAT must be one of text, json" in done.stderr
    assert "Traceback" not in done.stderr
