"""``processor runs``: the runs index listed from another terminal while ``processor run`` runs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.apps.support import ProcessorProcess, cli, wait_until


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("cli-runs")
    process = ProcessorProcess(root / "data", root / "processor.log", workers=2)
    try:
        process.start()
        process.wait_running()
        yield root / "data"
        process.check_alive()
        assert process.stop() == 0, process.log_text()
    finally:
        process.close()


def _runs(data_dir: Path, *args: str) -> dict[str, Any]:
    result = cli(data_dir, "runs", *args, "--json")
    assert result.returncode == 0, result.stderr
    shown: dict[str, Any] = json.loads(result.stdout)
    return shown


@pytest.fixture(scope="module")
def submitted(data_dir: Path) -> dict[str, str]:
    """Two runs that succeed and two that fail: run id -> pipeline."""
    runs = {}
    for pipeline, value in [
        ("steps3", 1),
        ("non_retryable", 2),
        ("steps3", 3),
        ("non_retryable", 4),
    ]:
        result = cli(data_dir, "submit", pipeline, "--input", json.dumps({"n": value}), "--json")
        assert result.returncode == 0, result.stderr
        runs[json.loads(result.stdout)["run_id"]] = pipeline

    def all_ended() -> bool:
        shown = _runs(data_dir, "--limit", "100")["runs"]
        return len(shown) == 4 and all(r["status"] != "running" for r in shown)

    wait_until(all_ended, 60, "the four runs to end", max_pause_s=0.2)
    return runs


def test_runs_lists_by_status_and_pipeline(data_dir: Path, submitted: dict[str, str]) -> None:
    failed = _runs(data_dir, "--status", "failed")
    assert {r["run_id"] for r in failed["runs"]} == {
        r for r, p in submitted.items() if p == "non_retryable"
    }
    assert failed["next_cursor"] is None
    steps3 = _runs(data_dir, "--pipeline", "steps3", "--status", "succeeded")["runs"]
    assert {r["run_id"] for r in steps3} == {r for r, p in submitted.items() if p == "steps3"}
    assert set(steps3[0]) >= {"run_id", "status", "phase", "submitted_ms", "partition"}
    assert _runs(data_dir, "--pipeline", "steps3", "--status", "failed")["runs"] == []


def test_runs_pages_with_the_cursor_it_prints(data_dir: Path, submitted: dict[str, str]) -> None:
    seen: list[str] = []
    cursor: str | None = None
    for _ in range(10):
        page = _runs(data_dir, "--limit", "1", *(["--cursor", cursor] if cursor else []))
        seen += [r["run_id"] for r in page["runs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(submitted) and len(seen) == len(submitted)
    text = cli(data_dir, "runs", "--limit", "1")
    assert text.returncode == 0 and "next page: --cursor " in text.stdout


def test_runs_since_takes_a_duration_or_a_time(data_dir: Path, submitted: dict[str, str]) -> None:
    assert len(_runs(data_dir, "--since", "10m")["runs"]) == len(submitted)
    assert _runs(data_dir, "--since", "2999-01-01T00:00:00Z")["runs"] == []
    assert _runs(data_dir, "--until", "2000-01-01")["runs"] == []
    newest = _runs(data_dir, "--limit", "1")["runs"][0]
    since = _runs(data_dir, "--since", str(newest["submitted_ms"]))["runs"]
    assert newest["run_id"] in {r["run_id"] for r in since}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cursor", "nonsense"], "invalid cursor"),
        (["--since", "yesterday-ish"], "is no time"),
        (["--limit", "0"], "limit must be between 1 and 1000"),
        (["--status", "done"], "unknown status"),
    ],
)
def test_runs_refuses_bad_input_with_a_reason(
    data_dir: Path, submitted: dict[str, str], args: list[str], message: str
) -> None:
    result = cli(data_dir, "runs", *args, "--json")
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert message in json.loads(result.stderr)["error"]
