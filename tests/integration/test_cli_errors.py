"""Results go to stdout; every error, refusals included, to stderr with a non-zero exit,
as ``{"error": ...}`` with ``--json`` (README, "Command line").

The refusals a running processor answers (submit, cancel, redrive, resolve) are in
test_cli.py, against its processor; here are the others: no processor answering, the
verifications that find differences (the report stays on stdout), usage errors and
settings refused before a command starts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from processor.config.settings import Settings
from processor.transport.base import TopicSpec
from processor.transport.embedded import EmbeddedTransport
from tests.apps.support import REPO_ROOT, cli, subprocess_env


def _with_env(
    data_dir: Path, env: dict[str, str], *args: str, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python -m processor ARGS`` with ``env`` on top of the test's environment."""
    return subprocess.run(
        [sys.executable, "-m", "processor", "--data-dir", str(data_dir), *args],
        cwd=REPO_ROOT,
        env={**subprocess_env(data_dir), **env},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def _error(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """An error printed with --json: one JSON object on stderr, nothing on stdout."""
    assert result.stdout == "", result.stdout
    shown: dict[str, Any] = json.loads(result.stderr)
    return shown


def test_a_submit_no_processor_answers_is_an_error_naming_the_queued_run(
    tmp_path: Path,
) -> None:
    args = ("submit", "steps3", "--input", "{}", "--wait", "0.2")
    queued = cli(tmp_path / "data", *args, "--json")
    assert queued.returncode == 3
    shown = _error(queued)
    assert (shown["created"], shown["queued"]) == (None, True)
    assert shown["error"] == f"no processor answered in 0.2s; run {shown['run_id']} is queued"
    plain = cli(tmp_path / "data", *args)
    assert (plain.returncode, plain.stdout) == (3, "")
    assert plain.stderr.startswith("error: no processor answered in 0.2s; run ")


def test_topics_that_drift_print_the_report_and_an_error(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    log = EmbeddedTransport(Settings(data_dir=data_dir).log_dir)
    admin = log.admin()
    try:  # the journal, kept a day where the declaration keeps it forever
        admin.create_topics([TopicSpec("runs.facts", 4, {"retention.ms": "86400000"})])
    finally:
        admin.close()
    drift = cli(data_dir, "topics", "apply", "--json")
    assert drift.returncode == 4
    report = json.loads(drift.stdout)
    assert report["drift"] == [
        {"topic": "runs.facts", "problem": "retention.ms=86400000, declared -1"}
    ]
    error = json.loads(drift.stderr)
    assert error == {"error": "topics differ from their declarations: runs.facts"}
    plain = cli(data_dir, "topics", "apply")
    assert plain.returncode == 4
    assert "drift " in plain.stdout
    assert plain.stderr == f"error: {error['error']}\n"


def test_a_replay_that_finds_differences_prints_the_report_and_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from processor import cli as cli_module
    from processor.restore import replay
    from processor.restore.replay import ReplayReport

    data_dir = tmp_path / "data"
    assert cli(data_dir, "topics", "apply").returncode == 0
    differing = ReplayReport(facts=3, runs=1, verified=False, differences=["runs: r-1", "x"])
    monkeypatch.setattr(replay, "replay", lambda *args, **kwargs: differing)
    args = ["--data-dir", str(data_dir), "replay", "--verify"]
    shown = CliRunner().invoke(cli_module.cli, [*args, "--json"])
    assert shown.exit_code == 4
    assert json.loads(shown.stdout)["differences"] == ["runs: r-1", "x"]
    assert json.loads(shown.stderr) == {"error": "replay --verify found 2 differences"}
    plain = CliRunner().invoke(cli_module.cli, args)
    assert plain.exit_code == 4
    assert "DIFFERENCES" in plain.stdout
    assert plain.stderr == "error: replay --verify found 2 differences\n"


def test_a_demo_that_does_not_pass_prints_the_report_and_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from processor import cli as cli_module
    from processor.examples import demo_runner
    from processor.examples.demo_runner import DemoReport

    failing = DemoReport(
        submitted=5,
        succeeded=4,
        failed=0,
        seconds=1.0,
        runs_per_s=5.0,
        p50_ms=1.0,
        p99_ms=2.0,
        replay_facts=40,
        replay_verified=False,
        transport="embedded",
    )
    monkeypatch.setattr(demo_runner, "run_demo", lambda *args, **kwargs: failing)
    args = ["--data-dir", str(tmp_path / "data"), "demo", "--runs", "5", "--json"]
    shown = CliRunner().invoke(cli_module.cli, args)
    assert shown.exit_code == 4
    assert json.loads(shown.stdout)["succeeded"] == 4
    expected = "the demo did not pass: 4 of 5 runs ended, replay verification failed"
    assert json.loads(shown.stderr) == {"error": expected}


def test_a_usage_error_with_json_is_json_on_stderr(tmp_path: Path) -> None:
    result = cli(tmp_path / "data", "history", "r-1", "--limit", "0", "--json")
    assert result.returncode == 2
    assert "--limit" in _error(result)["error"]
    plain = cli(tmp_path / "data", "history", "r-1", "--limit", "0")
    assert (plain.returncode, plain.stdout) == (2, "")
    assert "Usage: " in plain.stderr  # click's own words, without --json


def test_a_bad_log_format_with_json_is_json_on_stderr(tmp_path: Path) -> None:
    env = {"PROCESSOR_LOG_FORMAT": "xml"}
    result = _with_env(tmp_path / "data", env, "status", "r-1", "--json")
    assert result.returncode == 2
    assert _error(result) == {"error": "PROCESSOR_LOG_FORMAT must be one of text, json"}


@pytest.mark.parametrize("variable", ["PROCESSOR_RESUME_SECRET", "PROCESSOR_HTTP_TOKEN"])
@pytest.mark.parametrize("command", ["run", "worker"])
def test_a_placeholder_secret_stops_the_start_naming_the_variable(
    tmp_path: Path, command: str, variable: str
) -> None:
    """compose's old defaults: the processor and the worker started with them."""
    env = {variable: f"change-me-not-a-real-{variable.rsplit('_', 1)[1].lower()}"}
    args = (command, "--app", "tests.apps.pipelines:app", "--no-http", "--json")
    refused = _with_env(tmp_path / "data", env, *args, timeout_s=60)
    assert refused.returncode == 1
    error = _error(refused)["error"]
    assert error.startswith(f"invalid settings: {variable} is a placeholder, not a secret")
    assert env[variable] not in error
    assert not (tmp_path / "data").exists()  # refused before anything was created


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("submit", "steps3", "--input", "{}", "--deadline-s", "1e300"),
            "--deadline-s: a deadline must be from 0 to",
        ),
        (
            ("submit", "steps3", "--input", "{}", "--deadline-s", "-5"),
            "--deadline-s: a deadline must be from 0 to",
        ),
        (
            ("submit", "steps3", "--input", "{}", "--deadline-s", "inf"),
            "--deadline-s: a deadline must be a finite number of seconds",
        ),
        (("redrive", "run-1", "--from-step", str(2**40)), "--from-step: a step index must be"),
        (("redrive", "run-1", "--from-step", "-1"), "--from-step: a step index must be"),
    ],
)
def test_a_value_out_of_range_is_a_usage_error_not_a_traceback(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    result = cli(tmp_path / "data", *args, "--wait", "0.2")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"error: {message}"), result.stderr
    assert "Traceback" not in result.stderr
