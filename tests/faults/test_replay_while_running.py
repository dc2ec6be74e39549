"""``replay --verify`` against live projections that keep changing under it.

The processor may commit between the moment replay reads a live store's facts
offset and the moment it compares that store's rows; verify must still compare
like with like (one consistent view of each live store), not report differences
that only mean "the processor made progress".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import processor.restore.replay as replay_module
from processor.facts.models import RunSucceeded
from processor.restore.replay import replay
from tests.apps.support import LoopHarness


def _succeeded(harness: LoopHarness, run_id: str) -> bool:
    return any(isinstance(f, RunSucceeded) for f in harness.facts(run_id))


def test_replay_verify_of_an_idle_live_store_agrees(harness: LoopHarness, tmp_path: Path) -> None:
    run_id = harness.submit("patient", {"x": 1})
    (item,) = harness.drive(harness.new_work, "the attempt is dispatched")
    harness.complete(item)
    harness.drive(lambda: _succeeded(harness, run_id), "the run succeeds")
    deployment = harness.deployment
    report = replay(
        deployment.transport, deployment.topology, deployment.settings.state_dir, verify=True
    )
    assert report.verified is True, report.differences
    assert report.facts == len(harness.facts(run_id))
    assert report.runs == 1


def test_replay_verify_while_the_processor_commits(
    harness: LoopHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = harness.submit("patient", {"x": 2})
    (item,) = harness.drive(harness.new_work, "the attempt is dispatched")
    original_compare = replay_module._compare
    progressed: list[bool] = []

    def compare_after_progress(*args: Any) -> Any:
        if not progressed:  # the live processor commits while replay is under way
            harness.complete(item)
            harness.drive(lambda: _succeeded(harness, run_id), "the run succeeds")
            progressed.append(True)
        return original_compare(*args)

    monkeypatch.setattr(replay_module, "_compare", compare_after_progress)
    deployment = harness.deployment
    report = replay(
        deployment.transport, deployment.topology, deployment.settings.state_dir, verify=True
    )
    assert progressed == [True]
    assert report.verified is True, report.differences
