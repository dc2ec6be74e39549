"""processor.testing skips sleeps: a durable sleep wakes when the kit's clock says so."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from processor import LocalEnvironment
from processor.facts.models import SleepCompleted, SleepStarted
from processor.worker.pipeline import Application, Pipeline
from tests.apps.sleep_pipelines import NAP_S, nap

START = 1_800_000_000_000

dated = Pipeline("dated")


@dated.sleep_until()
def until_date(value: dict[str, Any]) -> datetime | None:
    """An aware datetime from the run input (None: no sleep)."""
    at = value.get("at_s")
    return None if at is None else datetime.fromtimestamp(at, tz=UTC)


@dated.step()
def done(value: dict[str, Any]) -> dict[str, Any]:
    return {"done": value}


kit_app = Application([nap, dated])


def test_advance_skips_a_sleep_and_the_next_step_runs_once() -> None:
    with LocalEnvironment(kit_app, start_ms=START) as env:
        run_id = env.submit("nap", {"id": "k-1"})
        started = env.wait_fact(run_id, SleepStarted)
        assert started.wake_ms == START + int(NAP_S * 1000)  # the kit's clock, not real time
        state = env.status(run_id)
        assert state is not None and state.phase == "sleeping"

        env.advance(NAP_S - 0.001)
        assert [f for f in env.history(run_id) if isinstance(f, SleepCompleted)] == []
        env.advance(0.001)
        result = env.wait(run_id)
        assert result.succeeded and result.output == {"shipped": {"id": "k-1", "prepared": True}}
        woke = env.wait_fact(run_id, SleepCompleted)
        assert woke.time_ms == started.wake_ms
        env.advance(3600)
        assert len([f for f in env.history(run_id) if isinstance(f, SleepCompleted)]) == 1


@pytest.mark.parametrize("at_s", [START // 1000 + 90, None])
def test_sleep_until_an_aware_datetime(at_s: int | None) -> None:
    with LocalEnvironment(kit_app, start_ms=START) as env:
        run_id = env.submit("dated", {"at_s": at_s})
        started = env.wait_fact(run_id, SleepStarted)
        if at_s is None:  # no sleep: it wakes at once
            assert started.wake_ms == START
        else:
            assert started.wake_ms == at_s * 1000
            env.advance(90)
        assert env.wait(run_id).output == {"done": {"at_s": at_s}}
