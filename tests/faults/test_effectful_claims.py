"""An effectful step runs once, however its worker is lost (issue 27, item 1).

Real processes on each transport: ``processor run --workers 0`` and ``processor
worker`` processes. The ``charging`` step appends a line to a ledger file (the
charge) and then holds. A worker is killed (``kill -9``) 0, 100, 500 and 900 ms after
its steps' effects began, or after their start was recorded, and another worker
starts; the redelivered work items reach it. Every charge happened once, and every
run waits for an operator with its attempt Unknown. A start-up of ``processor run``
with in-process workers under submits runs every step, effectful or plain, once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from processor.clients.client import Client, new_submit
from processor.facts.models import AttemptStepStarted
from processor.transport.deployment import ensure_topics
from tests.apps.control_pipelines import CHARGE_TIMEOUT_S, ledger_lines
from tests.apps.support import ProcessorProcess, wait_until
from tests.faults.crash_env import CrashEnv

pytestmark = pytest.mark.slow

APP = "tests.apps.control_pipelines:app"
#: How long after its anchor each run's worker is killed, in ms (the longest first).
DELAYS_MS = (900, 500, 100, 0)
#: Longer than any run of the tests: a killed worker's steps never end by themselves.
HOLD_S = 120.0
#: From a kill to what follows it: a redelivery, an Unknown attempt.
WITHIN_S = CHARGE_TIMEOUT_S + 45.0


def _client(env: CrashEnv) -> Client:
    deployment = env.deployment
    return Client(deployment.transport, deployment.topology, deployment.settings.state_dir)


def _submit(client: Client, pipeline: str, ledger: Path, run: str, hold_s: float) -> str:
    command = new_submit(pipeline, {"id": run, "ledger": str(ledger), "hold_s": hold_s})
    client.send(command)
    client.flush()
    return command.run_id


def _worker(env: CrashEnv, name: str) -> ProcessorProcess:
    worker = env.spawn(name, app=APP)
    worker.start()
    worker.wait_running()
    return worker


def _start_recorded(client: Client, run_id: str) -> bool:
    return any(isinstance(fact, AttemptStepStarted) for fact in client.history(run_id))


def _anchor(client: Client, ledger: Path, anchor: str) -> Callable[[str, str], bool]:
    """Whether a run has reached the anchor its kill is timed from."""
    if anchor == "effect":
        return lambda run, run_id: ledger_lines(ledger).get(run, 0) > 0
    return lambda run, run_id: _start_recorded(client, run_id)


def _wait_unknown(client: Client, runs: dict[str, str]) -> None:
    """Wait until each run's attempt is Unknown: the run waits for an operator."""
    for run, run_id in runs.items():

        def unknown(run_id: str = run_id) -> bool:
            state = client.status(run_id)
            return state is not None and state.phase == "unknown"

        wait_until(unknown, WITHIN_S, f"run {run} to be Unknown")


@pytest.mark.parametrize("anchor", ["effect", "start_report"])
def test_an_effectful_step_runs_once_when_its_worker_is_killed(
    crash_env: CrashEnv, tmp_path: Path, anchor: str
) -> None:
    env = crash_env
    env.process.workers = 0  # the steps run in worker processes only
    ensure_topics(env.deployment)
    env.process.start()
    env.process.wait_running()
    first = _worker(env, "worker-1")
    client = _client(env)
    ledger = tmp_path / "ledger"
    reached = _anchor(client, ledger, anchor)
    runs: dict[str, str] = {}  # the input's id -> run id
    anchored: dict[str, float] = {}
    # Each run reaches its anchor after the one before: the kill comes DELAYS_MS after
    # each one's anchor (or later, for the runs anchored first).
    for delay in DELAYS_MS:
        run = f"d{delay}"
        run_id = runs[run] = _submit(client, "charging", ledger, run, HOLD_S)
        wait_until(partial(reached, run, run_id), WITHIN_S, f"run {run} to reach {anchor}")
        anchored[run] = time.monotonic()
    kill_at = max(anchored[f"d{delay}"] + delay / 1000 for delay in DELAYS_MS)
    time.sleep(max(0.0, kill_at - time.monotonic()))  # the delay under test
    first.kill()
    if anchor == "start_report":  # as an operator finds them: Unknown, then a worker comes
        _wait_unknown(client, runs)
    second = _worker(env, "worker-2")

    def settled() -> bool:
        charged = ledger_lines(ledger)
        if any(count > 1 for count in charged.values()):
            return True  # charged twice: the assertion below says so
        log = second.log_text()
        return all(f"run {run_id} not run" in log for run_id in runs.values())

    wait_until(settled, WITHIN_S, "the second worker to take the redelivered work items")
    assert ledger_lines(ledger) == dict.fromkeys(runs, 1)
    _wait_unknown(client, runs)
    assert ledger_lines(ledger) == dict.fromkeys(runs, 1)


def test_a_start_up_under_submits_runs_each_step_once(crash_env: CrashEnv, tmp_path: Path) -> None:
    env = crash_env
    ensure_topics(env.deployment)
    client = _client(env)
    ledger = tmp_path / "ledger"
    runs: dict[str, str] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def submit_until_stopped() -> None:
        index = 0
        while not stop.is_set():
            pipeline = ("charging", "tallying")[index % 2]
            run = f"s{index}"
            run_id = _submit(client, pipeline, ledger, run, 1.0)
            with lock:
                runs[run] = run_id
            index += 1
            stop.wait(0.1)  # the pace of the submits, not a synchronization

    submitter = threading.Thread(target=submit_until_stopped, daemon=True)
    submitter.start()
    # Four in-process workers: the more there are, the likelier one joins the group after
    # another took its first items (those would run again, without the join barrier).
    env.process.workers = 4
    try:
        env.process.start()
        env.process.wait_running()
        # Submits go on while the workers take their first items.
        wait_until(lambda: len(ledger_lines(ledger)) >= 8, WITHIN_S, "the first steps to run")
    finally:
        stop.set()
        submitter.join(30)
    for run, run_id in runs.items():
        result = client.wait(run_id, timeout_s=WITHIN_S)
        assert result.status == "succeeded", (run, result)
    assert ledger_lines(ledger) == dict.fromkeys(runs, 1)
