"""kill -9 a real ``processor run`` while failed runs are being redriven.

``mend`` runs (``tests.apps.control_pipelines``) fail while their gate file is
missing; the gate is created and every run is redriven (half of them from step 0),
with the processor killed right after the redrive commands are sent and again
once the redriven runs are under way. Some redrive commands are sent twice with
the same id, across a kill. At the end each run has failed once, been redriven
exactly once and ended once after it (succeeded); its journal is gapless with no
repeated fact key, runs.results holds its two outcomes, and ``replay --verify``
agrees with the live projections. Two runs go through the CLI: ``processor
redrive``, and its refusal of a run that is not failed.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from processor.clients.client import Client, new_submit
from processor.facts.codec import codec, decode_fact
from processor.facts.models import (
    FactHeader,
    RedriveRun,
    RunFailed,
    RunOutcome,
    RunRedriven,
    RunStopped,
    RunSucceeded,
    StepCompleted,
)
from processor.facts.topics import TopicName
from processor.transport.deployment import ensure_topics
from tests.apps.support import TopicTail, read_topic, wait_until
from tests.faults.crash_env import CrashEnv

pytestmark = pytest.mark.slow

RUNS = 24
TERMINAL = (RunSucceeded, RunFailed, RunStopped)


class Journal:
    """Follows runs.facts: each run's facts in order."""

    def __init__(self, env: CrashEnv) -> None:
        topology = env.deployment.topology
        self.process = env.process
        self.reader = env.deployment.transport.reader()
        self.tail = TopicTail(self.reader, topology.name(TopicName.FACTS), topology.partitions)
        self.by_run: dict[str, list[FactHeader]] = defaultdict(list)

    def follow(self) -> None:
        self.process.check_alive()
        for record in self.tail.new():
            fact = decode_fact(record.value)
            self.by_run[fact.run_id].append(fact)

    def count(self, runs: list[str], kind: type[FactHeader]) -> int:
        self.follow()
        return sum(any(isinstance(f, kind) for f in self.by_run[r]) for r in runs)

    def ended_after_redrive(self, runs: list[str]) -> bool:
        self.follow()
        return all(
            any(isinstance(f, RunRedriven) for f in self.by_run[r])
            and isinstance(self.by_run[r][-1], TERMINAL)
            for r in runs
        )


def test_kill_9_during_redrives_ends_each_run_once_after_its_redrive(
    crash_env: CrashEnv, tmp_path: Path
) -> None:
    process, deployment = crash_env.process, crash_env.deployment
    ensure_topics(deployment)
    topology = deployment.topology
    gate = tmp_path / "gate"
    client = Client(deployment.transport, topology, deployment.settings.state_dir)
    journal = Journal(crash_env)
    try:
        process.start()
        runs = []
        for n in range(RUNS):
            command = new_submit("mend", {"gate": str(gate), "n": n, "send_s": 0.2})
            client.send(command)
            runs.append(command.run_id)
        client.flush()
        wait_until(lambda: journal.count(runs, RunFailed) == RUNS, 90, "every run to fail", 0.05)
        gate.touch()

        by_cli, by_client = runs[:2], runs[2:]
        from_zero = set(by_client[::2])
        commands = {
            run: RedriveRun(
                command_id=str(uuid.uuid4()),
                run_id=run,
                from_step=0 if run in from_zero else None,
                reason="gate fixed",
                requested_ms=0,
            )
            for run in by_client
        }
        first_half = by_client[: len(by_client) // 2]
        for run in first_half:
            client.send(commands[run])
        client.flush()
        assert process.kill() == -9  # the redrives are in runs.commands, some decided
        process.start()
        for run in by_client:  # the first half again, same ids: each still redrives once
            client.send(commands[run])
        client.flush()
        wait_until(lambda: journal.count(by_client, RunRedriven), 90, "a redrive", 0.01)
        in_flight = [r for r in by_client if not journal.ended_after_redrive([r])]
        assert process.kill() == -9  # redriven runs are under way
        assert in_flight, "the kill came after every redriven run had ended"
        process.start()
        process.wait_running()

        shown = crash_env.cli("redrive", by_cli[0], "--reason", "by hand", "--json")
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert json.loads(shown.stdout)["accepted"] is True
        shown = crash_env.cli("redrive", by_cli[1], "--from-step", "0", "--json")
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert json.loads(shown.stdout)["from_step"] == 0

        wait_until(lambda: journal.ended_after_redrive(runs), 120, "every run to end again", 0.1)
        refused = crash_env.cli("redrive", by_cli[0], "--json")
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert refused.stdout == ""  # a refusal is an error, on stderr
        assert json.loads(refused.stderr)["refusal"] == "not_failed"
        assert process.stop() == 0
    finally:
        client.close()
        journal.reader.close()

    reader = deployment.transport.reader()
    try:
        facts = [
            decode_fact(r.value)
            for r in read_topic(reader, topology.name(TopicName.FACTS), topology.partitions)
        ]
        outcomes = [
            codec().decode_as(r.value, RunOutcome)
            for r in read_topic(reader, topology.name(TopicName.OUTCOMES), topology.partitions)
        ]
    finally:
        reader.close()
    repeated = [k for k, n in Counter((f.run_id, f.fact_key) for f in facts).items() if n > 1]
    assert repeated == [], f"fact keys appended twice: {repeated[:5]}"
    by_run: dict[str, list[FactHeader]] = defaultdict(list)
    for fact in facts:
        by_run[fact.run_id].append(fact)
    assert by_run.keys() == set(runs)
    for run_id in runs:
        _story_is_exact(run_id, by_run[run_id], zero=run_id in from_zero or run_id == by_cli[1])
    statuses = defaultdict(list)
    for outcome in outcomes:
        statuses[outcome.run_id].append(outcome.status)
    assert statuses == {run: ["failed", "succeeded"] for run in runs}

    verify = crash_env.cli("replay", "--verify", "--json")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    report = json.loads(verify.stdout)
    assert report["verified"] is True, report["differences"]
    assert (report["facts"], report["runs"]) == (len(facts), len(runs))


def _story_is_exact(run_id: str, run: list[FactHeader], *, zero: bool) -> None:
    """Failed once, redriven once, then ended once (succeeded, every step done)."""
    where = f"{run_id}: {[type(f).__name__ for f in run]}"
    assert [f.seq for f in run] == list(range(1, len(run) + 1)), where
    redriven = [i for i, f in enumerate(run) if isinstance(f, RunRedriven)]
    terminal = [i for i, f in enumerate(run) if isinstance(f, TERMINAL)]
    assert len(redriven) == 1, where
    assert len(terminal) == 2 and terminal[0] < redriven[0] < terminal[1] == len(run) - 1, where
    assert isinstance(run[terminal[0]], RunFailed) and isinstance(run[-1], RunSucceeded), where
    mark = run[redriven[0]]
    assert isinstance(mark, RunRedriven)
    assert (mark.from_step, mark.failed_step) == (0 if zero else 1, 1), where
    again = [f.step for f in run[redriven[0] :] if isinstance(f, StepCompleted)]
    assert again == ([0, 1, 2] if zero else [1, 2]), where
    assert json.loads(run[-1].result)["trail"] == ["intake", "check", "send"], where  # type: ignore[attr-defined]
