"""``Client.current``: a run as of the end of runs.facts, from a stale store or none.

``processor status`` and ``history`` use it, so they answer on a machine that does
not own the run's partition (no store, or a store it no longer keeps up to date).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from processor.clients.client import Client
from processor.facts.codec import decode_fact
from processor.facts.models import RunSucceeded
from tests.apps.support import LoopHarness


def _client(harness: LoopHarness, state_dir: Path) -> Client:
    deployment = harness.deployment
    return Client(deployment.transport, deployment.topology, state_dir)


def test_a_stale_store_is_completed_from_the_log_and_no_store_reads_it_all(
    harness: LoopHarness, tmp_path: Path
) -> None:
    run_id = harness.submit("patient", {"x": 7})
    (item,) = harness.drive(harness.new_work, "the attempt is dispatched")
    live_dir = harness.deployment.settings.state_dir
    stale_dir = tmp_path / "stale-copy"
    shutil.copytree(live_dir, stale_dir, ignore=shutil.ignore_patterns("LOCK", "instance.lock"))
    harness.complete(item)
    harness.drive(
        lambda: any(isinstance(f, RunSucceeded) for f in harness.facts(run_id)), "success"
    )
    journal = [f.seq for f in harness.facts(run_id)]

    live = _client(harness, live_dir)
    expected = live.stored_status(run_id)
    assert expected is not None and expected.status == "succeeded"
    assert live.current(run_id).state == expected
    assert live.current(run_id).from_log == 0  # the live store has applied everything

    stale = _client(harness, stale_dir)
    old = stale.stored_status(run_id)  # the copy's own projection: before the result
    assert old is not None and old.status == "running"
    view = stale.current(run_id)
    assert view.state == expected
    assert 0 < view.from_log < len(journal)
    assert [decode_fact(raw).seq for raw in view.history] == journal

    nowhere = _client(harness, tmp_path / "no-state")
    assert nowhere.stored_status(run_id) is None
    view = nowhere.current(run_id)
    assert view.state == expected
    assert view.from_log == len(journal)
    assert [decode_fact(raw).seq for raw in view.history] == journal
    assert nowhere.current("no-such-run").state is None
