"""A timer decision that raises in a real ``processor run``: the run is quarantined,
the processor and its other runs go on, ``processor release`` resumes it once the bug
is gone, and ``replay --verify`` agrees (issue 30 item 5). The embedded log here;
``tests/kafka/test_quarantine_on_kafka.py`` runs the same scenario on Kafka."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.apps.support import ProcessorProcess, cli, wait_until

APP = "tests.apps.quarantine_pipelines:app"
#: ``processor ARGS`` against the process's deployment, to completion.
Cli = Callable[..., subprocess.CompletedProcess[str]]


def test_a_raising_timer_decision_quarantines_the_run_not_the_processor(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    process = ProcessorProcess(data_dir, tmp_path / "processor.log", app=APP)
    quarantine_scenario(process, lambda *args: cli(data_dir, *args), tmp_path / "bug-present")


def quarantine_scenario(process: ProcessorProcess, run_cli: Cli, gate: Path) -> None:
    """Start ``process`` (its app is ``APP``), plant the bug, see the run quarantined and
    the others go on, fix it, release, verify; stop the process."""
    gate.touch()
    try:
        process.start()
        process.wait_running()
        victim = _submit(run_cli, {"name": "victim", "gate": str(gate)})
        held = _until(run_cli, victim, "quarantined", lambda s: s["quarantine"])
        assert held["quarantine"]["source"] == "timer:sleep"
        assert held["quarantine"]["error_type"] == "RuntimeError"
        assert held["status"] == "running" and held["timers"] == []

        other = _submit(run_cli, {"name": "other"})  # the processor goes on
        assert _until(run_cli, other, "done", lambda s: s["status"] == "succeeded")
        process.check_alive()

        gate.unlink()  # the fix is deployed
        released = run_cli("release", victim, "--reason", "fixed", "--json")
        assert released.returncode == 0, released.stderr
        assert json.loads(released.stdout)["source"] == "timer:sleep"
        done = _until(run_cli, victim, "done", lambda s: s["status"] == "succeeded")
        assert done["quarantine"] is None
        again = run_cli("release", victim, "--json")
        assert again.returncode == 1 and json.loads(again.stderr)["refusal"] == "not_quarantined"

        history = run_cli("history", victim, "--json")
        types = [fact["type"] for fact in json.loads(history.stdout)]
        assert "RunQuarantined" in types and "RunReleased" in types

        verify = run_cli("replay", "--verify", "--json")
        assert verify.returncode == 0, verify.stdout + verify.stderr
        assert json.loads(verify.stdout)["verified"] is True
        process.check_alive()
        assert process.stop() == 0, process.log_text()
    finally:
        process.close()


def _status(run_cli: Cli, run_id: str) -> dict[str, Any] | None:
    result = run_cli("status", run_id, "--json")
    if result.returncode == 3:  # not in the projection yet
        return None
    assert result.returncode == 0, result.stderr
    shown: dict[str, Any] = json.loads(result.stdout)
    return shown


def _submit(run_cli: Cli, value: dict[str, Any]) -> str:
    result = run_cli("submit", "dozer", "--input", json.dumps(value), "--json")
    assert result.returncode == 0, result.stderr
    return str(json.loads(result.stdout)["run_id"])


def _until(run_cli: Cli, run_id: str, what: str, holds: Any) -> dict[str, Any]:
    return wait_until(
        lambda: (s := _status(run_cli, run_id)) is not None and holds(s) and s,
        60,
        f"run {run_id} {what}",
        max_pause_s=0.2,
    )
