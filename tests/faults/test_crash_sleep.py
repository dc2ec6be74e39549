"""kill -9 a real ``processor run`` while runs sleep: each sleep keeps its wake time,
fires once after the restart, and ``replay --verify`` agrees with the live state."""

from __future__ import annotations

import json

import pytest

from processor.clients.client import Client
from processor.facts.models import FactHeader, RunSucceeded, SleepCompleted, SleepStarted
from processor.transport.deployment import ensure_topics
from tests.apps.support import wait_until
from tests.faults.crash_env import CrashEnv

RUNS = 6


def _of(facts: list[FactHeader], kind: type[FactHeader]) -> list[FactHeader]:
    return [f for f in facts if isinstance(f, kind)]


def test_kill_9_during_a_sleep_then_restart_fires_each_sleep_once(crash_env: CrashEnv) -> None:
    process = crash_env.process
    process.app = "tests.apps.sleep_pipelines:app"
    deployment = crash_env.deployment
    ensure_topics(deployment)
    topology = deployment.topology
    client = Client(deployment.transport, topology, deployment.settings.state_dir)
    inputs: dict[str, int] = {}
    try:
        process.start()
        for n in range(RUNS):
            inputs[client.submit("doze", {"n": n}).run_id] = n
        runs = list(inputs)

        def asleep() -> bool:
            return all(_of(client.history(r), SleepStarted) for r in runs)

        wait_until(asleep, 60, "every run asleep")
        assert process.kill() == -9  # while they sleep
        wakes = {r: _of(client.history(r), SleepStarted)[0] for r in runs}
        sleeping = [r for r in runs if not _of(client.history(r), SleepCompleted)]
        assert sleeping, "the kill came after every sleep ended"
        shown = crash_env.cli("status", sleeping[0], "--json")  # processor status, from the log
        assert shown.returncode == 0, shown.stdout + shown.stderr
        status = json.loads(shown.stdout)
        assert status["phase"] == "sleeping"
        assert status["sleeping"] == {"step": 1, "wake_ms": wakes[sleeping[0]].wake_ms}
        process.start()
        for run_id in runs:
            assert client.wait(run_id, timeout_s=60).succeeded
        assert process.stop() == 0
    finally:
        histories = {r: client.history(r) for r in inputs}
        client.close()

    assert len(histories) == RUNS

    for run_id, facts in histories.items():
        [started] = _of(facts, SleepStarted)
        assert started == wakes[run_id]  # the same wake time, never measured again
        [woke] = _of(facts, SleepCompleted)
        assert isinstance(woke, SleepCompleted) and isinstance(started, SleepStarted)
        assert woke.wake_ms == started.wake_ms and woke.time_ms >= started.wake_ms
        [succeeded] = _of(facts, RunSucceeded)
        assert isinstance(succeeded, RunSucceeded)
        expected = {"awake": {"n": inputs[run_id], "wound_down": True}}
        assert json.loads(succeeded.result) == expected

    verify = crash_env.cli("replay", "--verify", "--json")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    report = json.loads(verify.stdout)
    assert report["verified"] is True, report["differences"]


pytestmark = pytest.mark.slow
