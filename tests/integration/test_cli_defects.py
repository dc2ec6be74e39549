"""The command line as a new user meets it: each defect of issue 17 that the CLI showed.

Every call is a fresh ``python -m processor`` process, except where a reply that
needs an Unknown attempt is faked in process (``resolve``).
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from processor.facts.models import CommandReply
from tests.apps.support import REPO_ROOT, ProcessorProcess, cli, subprocess_env
from tests.kafka_broker import kafka_bootstrap, unavailable_reason

APP = "tests.apps.pipelines:app"


def _error(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """An error printed with --json: one JSON object on stderr, nothing on stdout."""
    assert result.stdout == "", result.stdout
    shown: dict[str, Any] = json.loads(result.stderr)
    return shown


@pytest.mark.parametrize("command", ["status", "history", "cancel", "redrive"])
def test_a_query_where_nothing_has_run_says_no_run_and_creates_nothing(
    tmp_path: Path, command: str
) -> None:
    data_dir = tmp_path / "never-used"
    plain = cli(tmp_path / "unused", command, "r-1", "--data-dir", str(data_dir))
    assert (plain.returncode, plain.stderr.strip()) == (3, "error: no run r-1")
    shown = cli(tmp_path / "unused", command, "r-1", "--data-dir", str(data_dir), "--json")
    assert shown.returncode == 3
    assert _error(shown) == {"error": "no run r-1"}
    assert not data_dir.exists()


def test_rejected_where_nothing_has_run_is_an_empty_list(tmp_path: Path) -> None:
    data_dir = tmp_path / "never-used"
    result = cli(data_dir, "rejected", "--json")
    assert (result.returncode, json.loads(result.stdout)) == (0, [])
    assert not data_dir.exists()


def test_replay_verify_that_checked_nothing_fails(tmp_path: Path) -> None:
    mistyped = tmp_path / "typo"
    result = cli(mistyped, "replay", "--verify")
    assert result.returncode == 3
    assert "nothing to replay" in result.stderr
    assert "verified" not in result.stdout
    assert not mistyped.exists()

    empty = tmp_path / "empty"  # topics exist, but not one fact was ever written
    assert cli(empty, "topics", "apply").returncode == 0
    verify = cli(empty, "replay", "--verify", "--json")
    assert verify.returncode == 3
    assert "nothing to verify" in _error(verify)["error"]


def test_version() -> None:
    result = cli(Path("unused"), "--version")
    assert result.returncode == 0
    name, version = result.stdout.split()
    assert name == "processor" and version[0].isdigit(), result.stdout


def _first_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    """The first line ``proc`` prints on stdout, waiting at most ``timeout_s``."""
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    stdout = proc.stdout
    threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
    try:
        return lines.get(timeout=timeout_s)
    except queue.Empty:
        raise AssertionError(f"no line on stdout in {timeout_s}s") from None


def _start(data_dir: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "processor", *args],
        cwd=REPO_ROOT,
        env=subprocess_env(data_dir),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        _, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return proc.returncode, stderr


def test_run_prints_a_ready_line_on_stdout_with_json(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    proc = _start(data_dir, "run", "--app", APP, "--workers", "1", "--json")
    try:
        ready = json.loads(_first_line(proc, 60))
    finally:
        code, stderr = _stop(proc)
    assert ready["ready"] is True
    assert ready["broker"].startswith("embedded:")
    assert ready["partitions"] == list(range(4))  # alone, it owns every partition
    assert ready["workers"] == 1
    assert str(ready["instance_id"]), ready
    assert code == 0, stderr


def test_worker_takes_workers_json_and_the_old_threads_name(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    assert cli(data_dir, "topics", "apply").returncode == 0
    proc = _start(
        data_dir, "worker", "--app", APP, "--workers", "2", "--concurrency", "3", "--json"
    )
    try:
        assert json.loads(_first_line(proc, 60)) == {"ready": True, "workers": 2, "concurrency": 3}
    finally:
        assert _stop(proc)[0] == 0
    old = _start(data_dir, "worker", "--app", APP, "--threads", "3")
    try:
        assert _first_line(old, 60).strip() == "ready: 3 workers, 8 attempts at once each"
    finally:
        code, stderr = _stop(old)
    assert code == 0
    assert "--threads is deprecated; use --workers" in stderr


def test_worker_refuses_zero_workers(tmp_path: Path) -> None:
    refused = cli(tmp_path / "data", "worker", "--app", APP, "--workers", "0")
    assert refused.returncode == 2
    assert "processor worker needs --workers 1 or more" in refused.stderr


def test_a_worker_is_ready_once_its_announcement_is_on_the_log(tmp_path: Path) -> None:
    from processor.config.settings import Settings
    from processor.facts.codec import codec
    from processor.facts.models import WorkerAnnouncement
    from processor.facts.topics import TopicName
    from processor.transport.base import TopicPartition
    from processor.transport.deployment import Deployment

    data_dir = tmp_path / "data"
    assert cli(data_dir, "topics", "apply").returncode == 0
    proc = _start(data_dir, "worker", "--app", APP, "--workers", "2", "--json")
    try:
        assert json.loads(_first_line(proc, 60))["ready"] is True
        deployment = Deployment.from_settings(Settings(data_dir=data_dir))
        reader = deployment.transport.reader()
        try:
            results = TopicPartition(deployment.topology.name(TopicName.RESULTS), 0)
            announced = {
                message.worker_id
                for batch in reader.read(results, 0, reader.end_offset(results))
                for message in (codec().decode(r.value) for r in batch)
                if isinstance(message, WorkerAnnouncement)
            }
        finally:
            reader.close()
    finally:
        assert _stop(proc)[0] == 0
    assert len(announced) == 2  # both workers, before the ready line


def test_a_keyed_retry_with_deadline_s_returns_the_original_run(tmp_path: Path) -> None:
    process = ProcessorProcess(tmp_path / "data", tmp_path / "processor.log", workers=1)
    process.start()
    try:
        process.wait_running()
        args = ("submit", "steps3", "--input", '{"n": 2}', "--idempotency-key", "K-1")
        first = cli(process.data_dir, *args, "--deadline-s", "600", "--json")
        assert first.returncode == 0, first.stderr
        again = cli(process.data_dir, *args, "--deadline-s", "600", "--json")
        assert again.returncode == 0, again.stdout + again.stderr
        assert json.loads(again.stdout) == {
            "run_id": json.loads(first.stdout)["run_id"],
            "created": False,
        }
        other = cli(process.data_dir, *args, "--deadline-s", "60", "--json")
        assert other.returncode == 1
        assert _error(other)["refusal"] == "idempotency_conflict"
    finally:
        process.close()


def test_a_repeated_resolve_says_it_replayed_the_recorded_response(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from processor import cli as cli_module
    from processor.clients.client import Client

    recorded = CommandReply(
        command_id=str(uuid.uuid4()),
        run_id="r-1",
        created=False,
        detail="already applied",
        response=json.dumps({"action": "succeed"}),
    )
    monkeypatch.setattr(Client, "resolve", lambda *args, **kwargs: recorded)
    args = ["--data-dir", str(tmp_path), "resolve", "r-1", "--segment", "1", "--attempt", "1"]
    args += ["--generation", "1", "--idempotency-key", "op-1", "--succeed", "{}"]
    result = CliRunner().invoke(cli_module.cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert (shown["replayed"], shown["accepted"], shown["action"]) == (True, False, "succeed")
    text = CliRunner().invoke(cli_module.cli, args)
    assert "replayed the recorded response" in text.stdout


@pytest.mark.kafka
def test_the_demo_on_kafka_needs_no_secret(tmp_path: Path) -> None:
    bootstrap = kafka_bootstrap()
    if bootstrap is None:
        pytest.skip(unavailable_reason())
    prefix = f"t{uuid.uuid4().hex[:8]}."
    env = {**subprocess_env(tmp_path / "demo"), "PROCESSOR_TOPIC_PREFIX": prefix}
    demo = ("demo", "--broker", f"kafka://{bootstrap}", "--runs", "5", "--json")
    result = subprocess.run(
        [sys.executable, "-m", "processor", *demo],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert (report["succeeded"] + report["failed"], report["replay_verified"]) == (5, True)
