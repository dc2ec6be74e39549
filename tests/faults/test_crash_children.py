"""A child run under kill -9 between its submit and the commit, on the embedded log and Kafka.

A ``parent`` run's child step starts one ``kid`` run. A real ``processor run`` dies
with ``os._exit`` (tests/apps/child_pipelines.py) right after it produced the child's
``SubmitRun`` into the open transaction with the parent's dispatch facts (flushed to
the broker on Kafka), before the commit. The transaction never commits, so no
read_committed reader, the processor included, sees that submit. The restarted
processor decides the parent's result again and submits the same child, under the
same id and command id: the child starts once, its result reaches the parent, and
``replay --verify`` agrees with the live store.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from processor.clients.client import Client
from processor.facts.models import ChildRunLinked, FactHeader, RunSubmitted, RunSucceeded
from processor.model.children import child_run_id
from processor.transport.deployment import ensure_topics
from tests.apps.child_pipelines import CRASH_EXIT
from tests.apps.support import wait_until
from tests.faults.crash_env import CrashEnv

pytestmark = pytest.mark.slow

APP = "tests.apps.child_pipelines:app"


def _count(facts: list[FactHeader], kind: type[FactHeader]) -> int:
    return sum(isinstance(f, kind) for f in facts)


def test_kill_9_between_submitting_a_child_and_the_commit(crash_env: CrashEnv) -> None:
    process, deployment = crash_env.process, crash_env.deployment
    process.app = APP
    process.extra_env = {"TEST_CRASH_POINT": "after_child_submit"}
    ensure_topics(deployment)
    client = Client(deployment.transport, deployment.topology, deployment.settings.state_dir)
    try:
        process.start()
        run_id = client.submit("parent", 21).run_id
        child = child_run_id(run_id, 1, 0)
        proc = process.proc
        assert proc is not None
        wait_until(lambda: proc.poll() is not None, 90, "the crash after the child's submit")
        assert proc.returncode == CRASH_EXIT, process.log_text()[-3000:]
        process.close()
        assert client.history(child) == []  # the submit was never committed

        process.extra_env = {}
        process.start()
        try:
            result = client.wait(run_id, timeout_s=90)
        except TimeoutError:
            raise AssertionError(process.log_text()[-6000:]) from None
        assert result.succeeded, result
        assert result.output == {"got": 42}
        assert process.stop() == 0
        verify = crash_env.cli("replay", "--verify", "--json")
        assert verify.returncode == 0, verify.stdout + verify.stderr
        assert json.loads(verify.stdout)["verified"] is True, verify.stdout
        parent_facts, child_facts = client.history(run_id), client.history(child)
    finally:
        client.close()

    assert _count(child_facts, RunSubmitted) == 1
    assert _count(child_facts, ChildRunLinked) == 1
    assert _count(child_facts, RunSucceeded) == 1
    assert _count(parent_facts, RunSucceeded) == 1
    for facts in (parent_facts, child_facts):
        assert [f.seq for f in facts] == list(range(1, len(facts) + 1))
        assert max(Counter(f.fact_key for f in facts).values()) == 1
