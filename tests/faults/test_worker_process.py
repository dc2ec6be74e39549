"""``processor run``'s in-process workers run in one child process, which ends with it.

Real processes on each transport: the child is found by its parent pid, a step is
seen running in it (the step writes its own pid), and it is gone once the processor
is killed (-9), asks it to stop (SIGTERM: both exit 0), or loses it (the processor
stops with an error). ``PROCESSOR_WORKER_ISOLATION=thread`` runs no child.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from processor.clients.client import Client, new_submit
from processor.transport.deployment import ensure_topics
from tests.apps.support import wait_until
from tests.faults.crash_env import CrashEnv

pytestmark = pytest.mark.slow

CHILD_MODULE = b"processor.engine.worker_child"


def _children(parent: int) -> list[int]:
    """The live worker child processes of ``parent`` (by /proc: Linux)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # it ended meanwhile
        fields = stat.rpartition(")")[2].split()
        state, ppid = fields[0], int(fields[1])
        if ppid == parent and state != "Z" and CHILD_MODULE in cmdline:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def _run_step(env: CrashEnv, tmp_path: Path, name: str) -> tuple[Client, str, Path]:
    """Submit a lingering run whose step writes the pid it runs in; wait for it to begin."""
    deployment = env.deployment
    client = Client(deployment.transport, deployment.topology, deployment.settings.state_dir)
    marker = tmp_path / name
    command = new_submit("lingering", {"marker": str(marker), "sleep_s": 0, "pid_file": True})
    client.send(command)
    client.flush()
    wait_until(marker.exists, 60.0, "a worker to begin the step")
    return client, command.run_id, marker


def _start(env: CrashEnv) -> int:
    ensure_topics(env.deployment)
    env.process.start()
    env.process.wait_running()
    assert env.process.proc is not None
    return env.process.proc.pid


def test_steps_run_in_a_child_process_that_ends_with_a_killed_processor(
    crash_env: CrashEnv, tmp_path: Path
) -> None:
    parent = _start(crash_env)
    (child,) = wait_until(lambda: _children(parent), 60.0, "the workers' child process")
    client, run_id, marker = _run_step(crash_env, tmp_path, "began")
    assert client.wait(run_id, timeout_s=60).status == "succeeded"
    assert int(marker.read_text()) == child  # the step ran there, not in the processor
    crash_env.process.kill()
    wait_until(lambda: not _alive(child), 10.0, "the child to end with its killed parent")


def test_sigterm_stops_the_processor_and_its_child_cleanly(
    crash_env: CrashEnv, tmp_path: Path
) -> None:
    parent = _start(crash_env)
    (child,) = wait_until(lambda: _children(parent), 60.0, "the workers' child process")
    assert crash_env.process.stop() == 0
    wait_until(lambda: not _alive(child), 10.0, "the child to end after its parent")


def test_a_processor_that_loses_its_workers_process_stops_with_an_error(
    crash_env: CrashEnv,
) -> None:
    parent = _start(crash_env)
    (child,) = wait_until(lambda: _children(parent), 60.0, "the workers' child process")
    log = crash_env.process.log_text
    os.kill(child, signal.SIGKILL)
    proc = crash_env.process.proc
    assert proc is not None
    assert proc.wait(60) != 0
    assert "the in-process workers' process ended (exit -9)" in log()


def test_thread_isolation_runs_the_workers_in_the_processor(
    crash_env: CrashEnv, tmp_path: Path
) -> None:
    crash_env.process.extra_env = {"PROCESSOR_WORKER_ISOLATION": "thread"}
    parent = _start(crash_env)
    client, run_id, marker = _run_step(crash_env, tmp_path, "began")
    assert client.wait(run_id, timeout_s=60).status == "succeeded"
    assert int(marker.read_text()) == parent
    assert _children(parent) == []
