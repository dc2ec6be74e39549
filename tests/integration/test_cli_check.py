"""``processor check --app``: an application's definitions checked without running it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.apps.support import cli


def test_a_sound_application_is_outlined_with_its_segments(tmp_path: Path) -> None:
    done = cli(tmp_path, "check", "--app", "tests.apps.control_pipelines:app", "--json")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["ok"] is True
    by_name = {(p["pipeline"], p["version"]): p for p in shown["pipelines"]}
    timed = by_name[("timed", 1)]
    assert [(s["name"], s["kind"], s["segment"]) for s in timed["steps"]] == [
        ("hold", "step", 1),
        ("ask_clerk", "await", 1),
        ("finish_timed", "step", 2),
    ]
    assert timed["deadline_s"] == 3.0
    charging = by_name[("charging", 1)]["steps"][0]
    assert (charging["name"], charging["effectful"]) == ("charge_card", True)
    assert by_name[("booking", 1)]["steps"][0]["compensated"] is True
    assert not (tmp_path / "log").exists()  # nothing was run, no log was made


def test_the_text_outline_names_each_step(tmp_path: Path) -> None:
    done = cli(tmp_path, "check", "--app", "processor.examples.demo:app")
    assert done.returncode == 0, done.stderr
    assert "orders v1: 4 steps in 2 segments" in done.stdout
    assert "capture_payment" in done.stdout and "await" in done.stdout
    assert done.stdout.rstrip().endswith("ok: 1 pipeline version checked")


@pytest.mark.parametrize(
    ("app", "error"),
    [
        ("twice_named", "pipeline 'twice' has two steps named 'charge'"),
        ("no_steps", "pipeline 'hollow' has no steps"),
        ("compensates_nothing", "pipeline 'undo' has no step named 'bok'"),
    ],
)
def test_a_broken_definition_is_an_error_naming_what_is_wrong(
    tmp_path: Path, app: str, error: str
) -> None:
    done = cli(tmp_path, "check", "--app", f"tests.apps.broken_pipelines:{app}", "--json")
    assert done.returncode == 1
    assert done.stdout == ""
    assert error in json.loads(done.stderr)["error"]
