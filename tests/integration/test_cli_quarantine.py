"""A timer decision that raises in a real ``processor run`` (embedded log): the run is
quarantined, the processor and its other runs go on, ``processor release`` resumes it
once the bug is gone, and ``replay --verify`` agrees (issue 30 item 5)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.apps.support import ProcessorProcess, cli, wait_until


def _status(data_dir: Path, run_id: str) -> dict[str, Any] | None:
    result = cli(data_dir, "status", run_id, "--json")
    if result.returncode == 3:  # not in the projection yet
        return None
    assert result.returncode == 0, result.stderr
    shown: dict[str, Any] = json.loads(result.stdout)
    return shown


def _submit(data_dir: Path, value: dict[str, Any]) -> str:
    result = cli(data_dir, "submit", "dozer", "--input", json.dumps(value), "--json")
    assert result.returncode == 0, result.stderr
    return str(json.loads(result.stdout)["run_id"])


def _until(data_dir: Path, run_id: str, what: str, holds: Any) -> dict[str, Any]:
    return wait_until(
        lambda: (s := _status(data_dir, run_id)) is not None and holds(s) and s,
        60,
        f"run {run_id} {what}",
        max_pause_s=0.2,
    )


def test_a_raising_timer_decision_quarantines_the_run_not_the_processor(tmp_path: Path) -> None:
    gate = tmp_path / "bug-present"
    gate.touch()
    process = ProcessorProcess(
        tmp_path / "data", tmp_path / "processor.log", app="tests.apps.quarantine_pipelines:app"
    )
    data_dir = tmp_path / "data"
    try:
        process.start()
        process.wait_running()
        victim = _submit(data_dir, {"name": "victim", "gate": str(gate)})
        held = _until(data_dir, victim, "quarantined", lambda s: s["quarantine"])
        assert held["quarantine"]["source"] == "timer:sleep"
        assert held["quarantine"]["error_type"] == "RuntimeError"
        assert held["status"] == "running" and held["timers"] == []

        other = _submit(data_dir, {"name": "other"})  # the processor goes on
        assert _until(data_dir, other, "done", lambda s: s["status"] == "succeeded")
        process.check_alive()

        gate.unlink()  # the fix is deployed
        released = cli(data_dir, "release", victim, "--reason", "fixed", "--json")
        assert released.returncode == 0, released.stderr
        assert json.loads(released.stdout)["source"] == "timer:sleep"
        done = _until(data_dir, victim, "done", lambda s: s["status"] == "succeeded")
        assert done["quarantine"] is None
        again = cli(data_dir, "release", victim, "--json")
        assert again.returncode == 1 and json.loads(again.stderr)["refusal"] == "not_quarantined"

        history = cli(data_dir, "history", victim, "--json")
        types = [fact["type"] for fact in json.loads(history.stdout)]
        assert "RunQuarantined" in types and "RunReleased" in types

        verify = cli(data_dir, "replay", "--verify", "--json")
        assert verify.returncode == 0, verify.stdout + verify.stderr
        assert json.loads(verify.stdout)["verified"] is True
        process.check_alive()
        assert process.stop() == 0, process.log_text()
    finally:
        process.close()
