"""A rolling deployment of new pipeline versions with real processes, on each transport.

``processor run --workers 0`` (the processor alone) and ``processor worker`` processes,
each loading a release of ``tests/apps/version_pipelines.py`` (release N: versions 1
to N), are stopped and started with other releases the way an operator rolls one out.
Everything a user would do goes through the CLI (submit, status, runs, requests,
complete, replay); the test waits for outcomes with the client.

1. Release 1: a ``greet`` run is in flight in the v1 worker's step (held there by a
   gate file) and a ``relay`` run waits at its await.
2. Release 2: the processor restarts with v1+v2, a v1+v2 worker starts, the gate opens
   and the v1 worker stops (its step ends first). A new run is pinned to v2; both old
   runs end on v1, the relay one in the v1+v2 worker, which runs v1's code because the
   run is pinned to v1 (unpinned, it would run the latest, v2).
3. Release 3 on the processor only: a new run is pinned to v3, which no worker loads.
   ``processor status`` and ``processor runs`` show it ``definition_blocked``, nothing
   charged. A v1..v3 worker starts and the v1+v2 one stops: the run succeeds on v3.
4. Every run ended once, attempts were never failed, retried or lost, and
   ``processor replay --verify`` agrees with the live stores.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from processor.clients.client import Client
from processor.facts.models import (
    AttemptLost,
    RetryScheduled,
    RunDefinitionBlocked,
    SegmentAttemptStarted,
    SegmentFailed,
)
from processor.transport.deployment import ensure_topics
from tests.apps.support import ProcessorProcess, wait_until
from tests.apps.version_pipelines import RELAY_TARGET
from tests.faults.crash_env import CrashEnv
from tests.kafka.support import assert_exactly_once, read_facts, read_outcomes
from tests.web.support import metrics, sample

pytestmark = pytest.mark.slow

#: Short, so a processor's warm-up (it holds no run back for one interval after it
#: starts: README, "Versions and definition_blocked runs") takes a second, not five.
ANNOUNCE_INTERVAL_MS = 1_000
#: From a submit, a completion or a worker's start to the outcome it leads to.
OUTCOME_WITHIN_S = 60.0


class Rollout:
    """The processes of one deployment (all of one transport), and the CLI calls of its
    operator."""

    def __init__(self, env: CrashEnv) -> None:
        self.env = env
        self.processor = env.process
        self.processor.workers = 0  # steps run in the worker processes only
        self.workers: list[ProcessorProcess] = []  # the worker processes running
        deployment = env.deployment
        ensure_topics(deployment)
        self.client = Client(
            deployment.transport, deployment.topology, deployment.settings.state_dir
        )

    def deploy_processor(self, release: int) -> None:
        """Stop the processor if it runs; start it with ``release``."""
        if self.processor.proc is not None:
            assert self.processor.stop() == 0, self.processor.log_text()[-3000:]
        self._start(self.processor, release)

    def start_worker(self, release: int) -> ProcessorProcess:
        """Start a worker process with ``release``; return once the processor has heard
        it, as an operator checks (``processor_live_workers``) before stopping an old one."""
        worker = self.env.spawn(f"worker-release{release}", app=_app(release))
        self._start(worker, release)
        self.workers.append(worker)
        wait_until(
            lambda: self.live_workers() == len(self.workers),
            OUTCOME_WITHIN_S,
            f"the processor to hear {worker.log_path.stem}",
            max_pause_s=0.2,
        )
        return worker

    def stop_worker(self, worker: ProcessorProcess) -> None:
        """Stop a worker process (SIGTERM: it lets its running steps end first)."""
        self.workers.remove(worker)
        assert worker.stop() == 0, worker.log_text()[-3000:]

    def live_workers(self) -> float:
        """The processor's ``processor_live_workers`` gauge, from its /metrics."""
        url = wait_until(self.processor.http_address, OUTCOME_WITHIN_S, "the HTTP address")
        with httpx.Client(base_url=url, timeout=30) as http:
            return sample(metrics(http), "processor_live_workers")

    def _start(self, process: ProcessorProcess, release: int) -> None:
        process.app = _app(release)
        process.extra_env = {"PROCESSOR_WORKER_ANNOUNCE_INTERVAL_MS": str(ANNOUNCE_INTERVAL_MS)}
        process.start()
        process.wait_running()

    def cli_json(self, *args: str) -> Any:
        """``processor ARGS --json``, which must succeed; what it printed."""
        done = self.env.cli(*args, "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)

    def submit(self, pipeline: str, value: dict[str, Any]) -> str:
        receipt = self.cli_json("submit", pipeline, "--input", json.dumps(value))
        assert receipt["created"] is True, receipt
        return str(receipt["run_id"])

    def status(self, run_id: str) -> dict[str, Any]:
        shown: dict[str, Any] = self.cli_json("status", run_id)
        return shown

    def status_when(self, run_id: str, phase: str) -> dict[str, Any]:
        """``processor status`` of the run once it shows ``phase``."""
        found: dict[str, Any] = wait_until(
            lambda: (shown := self.status(run_id))["phase"] == phase and shown,
            OUTCOME_WITHIN_S,
            f"run {run_id} in phase {phase}",
            max_pause_s=0.2,
        )
        return found

    def result(self, run_id: str) -> Any:
        """The run's output, once it has succeeded."""
        ended = self.client.wait(run_id, timeout_s=OUTCOME_WITHIN_S)
        assert ended.succeeded, ended
        return ended.output

    def close(self) -> None:
        self.client.close()


def _app(release: int) -> str:
    return f"tests.apps.version_pipelines:release{release}"


def test_a_rolling_deployment_pins_old_runs_and_holds_back_undeployed_versions(
    crash_env: CrashEnv, tmp_path: Path
) -> None:
    rollout = Rollout(crash_env)
    try:
        expected = _roll_out(rollout, tmp_path)
    finally:
        rollout.close()
    _assert_ended_once_and_uncharged(crash_env, expected)
    report = rollout.cli_json("replay", "--verify")
    assert report["verified"] is True, report["differences"]
    assert report["runs"] == len(expected)


def _roll_out(rollout: Rollout, tmp_path: Path) -> dict[str, Any]:
    """Deploy releases 1, 2 and 3 with runs across them; each run id -> its output."""
    # 1. Release 1: one run in flight in a step, one waiting at an await.
    rollout.deploy_processor(1)
    worker_v1 = rollout.start_worker(1)
    began, gate = tmp_path / "began", tmp_path / "gate"
    held = {"who": "held", "began": str(began), "gate": str(gate)}
    in_step = rollout.submit("greet", held)
    awaiting = rollout.submit("relay", {"who": "awaiting"})
    wait_until(began.exists, OUTCOME_WITHIN_S, "the v1 worker to begin the held step")
    assert rollout.status(in_step)["pipeline_version"] == 1
    assert rollout.status_when(awaiting, "suspended")["pipeline_version"] == 1

    # 2. Release 2: the processor, then a new worker; the old worker finishes its step
    # and stops. New runs are pinned to v2, old ones finish on v1.
    rollout.deploy_processor(2)
    worker_v2 = rollout.start_worker(2)
    gate.touch()
    rollout.stop_worker(worker_v1)
    fresh = rollout.submit("greet", {"who": "fresh"})
    assert rollout.result(fresh) == {"who": "fresh", "ran": 2}
    assert rollout.result(in_step) == {**held, "ran": 1}
    (request,) = wait_until(
        lambda: rollout.cli_json("requests", "--run", awaiting),
        OUTCOME_WITHIN_S,
        "the relay run's pending request",
    )
    assert request["target"] == RELAY_TARGET
    rollout.cli_json("complete", request["token"], "--payload", '{"reply": "hello"}')
    assert rollout.result(awaiting) == {"answer": {"reply": "hello"}, "ran": 1}

    # 3. Release 3 on the processor only: the new run waits, uncharged, for a worker
    # that loads v3, and goes on once one starts (and the v1+v2 worker leaves).
    rollout.deploy_processor(3)
    blocked = rollout.submit("greet", {"who": "blocked"})
    shown = rollout.status_when(blocked, "definition_blocked")
    assert (shown["status"], shown["pipeline_version"]) == ("running", 3), shown
    assert (shown["step_attempts"], shown["infrastructure_losses"]) == (0, 0), shown
    assert shown["retry_reason"] is None, shown
    assert shown["blocked"]["waiting_for"] == "a live worker that loads greet v3", shown

    def listed_blocked() -> dict[str, Any] | None:
        listing = rollout.cli_json("runs", "--status", "running")
        return next((run for run in listing["runs"] if run["run_id"] == blocked), None)

    # The listing reads only the processor's store, written just after each commit;
    # the status above reads the journal's tail as well, so it may see the run first.
    row = wait_until(
        listed_blocked, OUTCOME_WITHIN_S, "the blocked run in the listing", max_pause_s=0.2
    )
    assert (row["phase"], row["pipeline_version"]) == ("definition_blocked", 3), row
    worker_v3 = rollout.start_worker(3)
    rollout.stop_worker(worker_v2)
    assert rollout.result(blocked) == {"who": "blocked", "ran": 3}

    # 4. Everything stops cleanly.
    rollout.stop_worker(worker_v3)
    assert rollout.processor.stop() == 0, rollout.processor.log_text()[-3000:]
    return {
        in_step: {**held, "ran": 1},
        awaiting: {"answer": {"reply": "hello"}, "ran": 1},
        fresh: {"who": "fresh", "ran": 2},
        blocked: {"who": "blocked", "ran": 3},
    }


def _assert_ended_once_and_uncharged(env: CrashEnv, expected: dict[str, Any]) -> None:
    """Each run succeeded exactly once with its expected output (in runs.facts and in
    runs.results); no attempt failed, was retried or lost; only the v3 run was blocked,
    and its one attempt ran once a worker loaded v3."""
    reader = env.deployment.transport.reader()
    topology = env.deployment.topology
    try:
        facts = read_facts(reader, topology)
        outcomes = read_outcomes(reader, topology)
    finally:
        reader.close()
    assert_exactly_once(facts, expected)
    assert sorted(o.run_id for o in outcomes) == sorted(expected)
    assert {o.status for o in outcomes} == {"succeeded"}
    charged = [f for f in facts if isinstance(f, SegmentFailed | RetryScheduled | AttemptLost)]
    assert charged == []
    (blocked,) = (run_id for run_id, output in expected.items() if output.get("ran") == 3)
    held_back = [f for f in facts if isinstance(f, RunDefinitionBlocked)]
    assert held_back and {f.run_id for f in held_back} == {blocked}
    assert {f.reason for f in held_back} <= {"no_live_worker", "worker_lacks_version"}
    assert {f.step_attempts for f in held_back} == {0}
    started = [f for f in facts if isinstance(f, SegmentAttemptStarted) and f.run_id == blocked]
    assert {f.attempt for f in started} == {1}  # the same attempt, never a retry
