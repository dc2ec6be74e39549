"""The command line, used from "another terminal" while ``processor run`` is running.

One ``processor run`` subprocess (embedded log, a temporary data dir) serves the
whole module; every CLI call is a fresh ``python -m processor`` process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from processor.config.settings import Settings
from processor.facts.topics import TopicName
from processor.transport.base import TopicPartition
from processor.transport.deployment import Deployment
from tests.apps.pipelines import expected_steps3_result
from tests.apps.support import REPO_ROOT, ProcessorProcess, cli, subprocess_env, wait_until


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The data dir of a ``processor run`` that stays up for the whole module."""
    root = tmp_path_factory.mktemp("cli")
    process = ProcessorProcess(root / "data", root / "processor.log", workers=2)
    try:
        process.start()
        process.wait_running()
        yield root / "data"
        process.check_alive()
        assert process.stop() == 0, process.log_text()
    finally:
        process.close()


def _json(result: Any) -> Any:
    assert result.stdout.strip(), f"no output; stderr: {result.stderr}"
    return json.loads(result.stdout)


def _json_error(result: Any) -> Any:
    """An error with ``--json``: JSON on stderr, nothing on stdout."""
    assert result.stdout == "", result.stdout
    return json.loads(result.stderr)


def _submit(data_dir: Path, *args: str) -> tuple[int, dict[str, Any]]:
    result = cli(data_dir, "submit", *args, "--json")
    return result.returncode, _json(result)


def _succeeded_status(data_dir: Path, run_id: str) -> dict[str, Any]:
    def status() -> dict[str, Any] | None:
        result = cli(data_dir, "status", run_id, "--json")
        if result.returncode == 3:  # not in the projection yet
            return None
        assert result.returncode == 0, result.stderr
        shown: dict[str, Any] = _json(result)
        return shown if shown["status"] == "succeeded" else None

    return wait_until(status, 60, f"run {run_id} to succeed", max_pause_s=0.2)


def test_submit_prints_the_run_id_and_created(data_dir: Path) -> None:
    code, shown = _submit(data_dir, "steps3", "--input", '{"n": 4}')
    assert code == 0
    assert set(shown) == {"run_id", "created"}
    assert shown["created"] is True
    assert str(uuid.UUID(shown["run_id"])) == shown["run_id"]


def test_idempotency_key_returns_the_same_run_and_refuses_a_conflict(data_dir: Path) -> None:
    key = f"order-{uuid.uuid4()}"
    code, first = _submit(data_dir, "steps3", "--input", '{"n": 8}', "--idempotency-key", key)
    assert (code, first["created"]) == (0, True)

    # The same fields again (JSON spelled differently): the original run, not created.
    code, again = _submit(data_dir, "steps3", "--input", '{ "n" : 8 }', "--idempotency-key", key)
    assert code == 0
    assert again == {"run_id": first["run_id"], "created": False}

    # The same key with a different input is refused: an error, on stderr.
    args = ("submit", "steps3", "--input", '{"n": 9}', "--idempotency-key", key)
    refused = cli(data_dir, *args, "--json")
    assert refused.returncode == 1
    conflict = _json_error(refused)
    assert conflict["refusal"] == "idempotency_conflict"
    assert conflict["error"].startswith("refused: idempotency_conflict: ")
    assert conflict["run_id"] == first["run_id"]
    assert conflict["created"] is False

    # The refused submit did not change the run: it finishes with the first input.
    status = _succeeded_status(data_dir, first["run_id"])
    assert status["result"] == expected_steps3_result(8)


def test_status_and_history_of_a_finished_run(data_dir: Path) -> None:
    code, submitted = _submit(data_dir, "steps3", "--input", '{"n": 13}')
    assert code == 0
    run_id = submitted["run_id"]

    status = _succeeded_status(data_dir, run_id)
    assert status["run_id"] == run_id
    assert (status["pipeline"], status["pipeline_version"]) == ("steps3", 1)
    assert status["result"] == expected_steps3_result(13)
    assert status["error"] is None

    result = cli(data_dir, "history", run_id, "--json")
    assert result.returncode == 0, result.stderr
    facts = _json(result)
    assert [f["seq"] for f in facts] == list(range(1, len(facts) + 1))
    assert facts[0]["type"] == "RunSubmitted"
    assert facts[0]["input"] == {"n": 13}
    assert facts[-1]["type"] == "RunSucceeded"
    assert facts[-1]["result"] == expected_steps3_result(13)
    assert {f["run_id"] for f in facts} == {run_id}
    steps = [f["step"] for f in facts if f["type"] == "StepCompleted"]
    assert steps == [0, 1, 2]
    assert status["version"] == len(facts)

    text = cli(data_dir, "history", run_id)
    assert text.returncode == 0
    assert "RunSubmitted" in text.stdout.splitlines()[0]


def test_unknown_run_exits_3(data_dir: Path) -> None:
    unknown = str(uuid.uuid4())
    status = cli(data_dir, "status", unknown, "--json")
    assert status.returncode == 3
    assert unknown in _json_error(status)["error"]
    history = cli(data_dir, "history", unknown)
    assert history.returncode == 3
    assert unknown in history.stderr


def test_submit_to_an_unknown_pipeline_is_refused(data_dir: Path) -> None:
    refused = cli(data_dir, "submit", "no_such_pipeline", "--input", "{}", "--json")
    assert refused.returncode == 1
    assert _json_error(refused)["refusal"] == "unknown_pipeline"
    plain = cli(data_dir, "submit", "no_such_pipeline", "--input", "{}")
    assert (plain.returncode, plain.stdout) == (1, "")
    assert plain.stderr.startswith("error: refused: unknown_pipeline: ")


@pytest.fixture(scope="module")
def finished_run(data_dir: Path) -> str:
    """A run of the module's processor that has succeeded."""
    code, submitted = _submit(data_dir, "steps3", "--input", '{"n": 3}')
    assert code == 0
    _succeeded_status(data_dir, submitted["run_id"])
    return str(submitted["run_id"])


#: Each command a processor can refuse, with what it refuses about a succeeded run.
REFUSED_COMMANDS = [
    (("cancel",), "run_terminal"),
    (("redrive",), "not_failed"),
    (
        (
            "resolve",
            *("--segment", "1", "--attempt", "1", "--generation", "1"),
            *("--idempotency-key", "op-1", "--retry"),
        ),
        "stale_attempt",
    ),
]


@pytest.mark.parametrize(("command", "refusal"), REFUSED_COMMANDS)
def test_a_refused_command_is_an_error_on_stderr(
    data_dir: Path, finished_run: str, command: tuple[str, ...], refusal: str
) -> None:
    name, *options = command
    refused = cli(data_dir, name, finished_run, *options, "--json")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    shown = _json_error(refused)
    assert (shown["refusal"], shown["run_id"]) == (refusal, finished_run)
    assert shown["error"] == f"refused: {refusal}: {shown['detail']}"
    plain = cli(data_dir, name, finished_run, *options)
    assert (plain.returncode, plain.stdout) == (1, "")
    assert plain.stderr == f"error: refused: {refusal}: {shown['detail']}\n"


def test_replay_verify_agrees_with_the_live_projections(data_dir: Path) -> None:
    code, submitted = _submit(data_dir, "steps3", "--input", '{"n": 1}')
    assert code == 0
    _succeeded_status(data_dir, submitted["run_id"])

    result = cli(data_dir, "replay", "--verify", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = _json(result)
    assert report["verified"] is True, report["differences"]
    assert report["differences"] == []

    # Every committed fact was replayed, and every run the module submitted is there.
    deployment = Deployment.from_settings(Settings(data_dir=data_dir))
    reader = deployment.transport.reader()
    facts = deployment.topology.name(TopicName.FACTS)
    try:
        in_log = sum(
            reader.end_offset(TopicPartition(facts, p))
            for p in range(deployment.topology.partitions)
        )
    finally:
        reader.close()
    assert report["facts"] == in_log
    assert report["runs"] >= 1


def test_invalid_input_exits_2(data_dir: Path) -> None:
    result = cli(data_dir, "submit", "steps3", "--input", "{not json", "--json")
    assert result.returncode == 2
    assert "--input" in _json_error(result)["error"]
    plain = cli(data_dir, "submit", "steps3", "--input", "[1,")
    assert plain.returncode == 2
    assert "--input" in plain.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("submit", "steps3", "--input", "{}"),
        ("status", "some-run"),
        ("replay", "--verify"),
    ],
)
def test_nonsense_broker_is_a_clear_error(tmp_path: Path, args: tuple[str, ...]) -> None:
    result = cli(tmp_path, "--broker", "nonsense", *args)
    assert result.returncode != 0
    assert "broker" in result.stderr
    assert "kafka://" in result.stderr  # says what a broker URL looks like
    assert "Traceback" not in result.stderr


def test_a_second_processor_on_the_same_data_dir_is_refused(data_dir: Path) -> None:
    result = cli(data_dir, "run", "--app", "tests.apps.pipelines:app", timeout_s=60)
    assert result.returncode == 1
    assert "another processor is running with the state directory" in result.stderr


def test_demo_that_cannot_start_says_why(tmp_path: Path) -> None:
    env = {**subprocess_env(tmp_path / "demo"), "PROCESSOR_RESUME_SECRET": "too-short"}
    result = subprocess.run(
        [sys.executable, "-m", "processor", "demo", "--runs", "5", "--json"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert "PROCESSOR_RESUME_SECRET must be at least 16 characters" in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def _demo(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "processor", "demo", "--runs", "5", "--json"],
        cwd=REPO_ROOT,
        env={**subprocess_env(tmp_path / "demo"), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_demo_runs_with_a_rotated_key_list(tmp_path: Path) -> None:
    """A processor configured with a list of two keys signs, verifies and completes runs."""
    keys = "k2:second-key-0123456789abcdef,k1:first-key-0123456789abcdef"
    result = _demo(tmp_path, PROCESSOR_RESUME_SECRETS=keys)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["succeeded"] == 5 and report["failed"] == 0


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PROCESSOR_RESUME_SECRETS": "k1:short"}, "key 'k1' must be at least 16 characters"),
        (
            {
                "PROCESSOR_RESUME_SECRETS": "k1:first-key-0123456789abcdef",
                "PROCESSOR_RESUME_SECRET": "single-key-0123456789abcdef",
            },
            "not both",
        ),
    ],
)
def test_a_bad_key_list_stops_the_start_with_a_reason(
    tmp_path: Path, env: dict[str, str], message: str
) -> None:
    result = _demo(tmp_path, **env)
    assert result.returncode == 1, result.stderr
    assert message in result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert "first-key-0123456789abcdef" not in result.stdout + result.stderr
