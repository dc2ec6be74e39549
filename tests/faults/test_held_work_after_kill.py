"""Work held by the in-process workers of a killed processor comes back with it at once.

``processor run`` is killed (-9) while one of its workers runs a step; restarted, its
workers rejoin with the same ids (static members) and are handed again the work items
they held: the run completes seconds after the restart, not after the step's timeout
(120 s here). Measured: 3.6 s embedded, 6.6 s Kafka; before static members, 13.3 s on
Kafka and, on the embedded log, nothing until the attempt's timeout from dispatch
(which then failed the run: its one attempt was used up).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from processor.clients.client import Client, new_submit
from processor.facts.models import AttemptStepStarted, SegmentFailed
from processor.transport.deployment import ensure_topics
from tests.apps.control_pipelines import LINGER_TIMEOUT_S
from tests.apps.support import run_facts, wait_until
from tests.faults.crash_env import CrashEnv

pytestmark = pytest.mark.slow

#: From the restart to the run's end: the step's 2 s, a restart and a restore.
BACK_WITHIN_S = 30.0


def test_work_held_by_a_killed_processor_is_run_again_as_soon_as_it_is_back(
    crash_env: CrashEnv, tmp_path: Path
) -> None:
    process, deployment = crash_env.process, crash_env.deployment
    ensure_topics(deployment)
    process.start()
    process.wait_running()
    client = Client(deployment.transport, deployment.topology, deployment.settings.state_dir)
    marker = tmp_path / "began"
    command = new_submit("lingering", {"marker": str(marker), "sleep_s": 2})
    client.send(command)
    client.flush()
    wait_until(marker.exists, 60.0, "a worker to begin the step")
    process.kill()
    marker.unlink()

    process.start()
    restarted = time.monotonic()
    reader = deployment.transport.reader()
    try:
        outcome = client.wait(command.run_id, timeout_s=BACK_WITHIN_S + 30)
        took = time.monotonic() - restarted
        facts = run_facts(reader, deployment, command.run_id)
    finally:
        reader.close()
    print(f"restart to completion: {took:.1f}s ({crash_env.transport})")
    assert outcome.status == "succeeded"
    assert took < BACK_WITHIN_S < LINGER_TIMEOUT_S
    assert marker.exists()  # the held item ran again after the restart
    assert not any(isinstance(f, SegmentFailed) for f in facts)
    assert not any(isinstance(f, AttemptStepStarted) and f.redelivered for f in facts)
