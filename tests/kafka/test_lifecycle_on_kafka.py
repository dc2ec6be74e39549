"""The run lifecycle on a real Kafka broker, end to end.

A ``Host`` (processor loop plus two worker threads) runs in this process on a
Kafka deployment of its own (unique topic prefix and groups); clients submit
through runs.commands like any producer, and the CLI is used from "another
terminal" as a subprocess. Checked from the journal (runs.facts), runs.dlq and
runs.results: runs succeed; a transient failure is retried from the failed step;
an always-failing step fails the run after its attempts with a dead letter; a
non-retryable error fails at once; idempotent submits; ``replay --verify``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from processor.clients.client import Client, new_submit
from processor.engine.host import Host
from processor.facts.models import (
    DeadLetter,
    FactHeader,
    RetryScheduled,
    RunFailed,
    RunOutcome,
    RunSucceeded,
    SegmentAttemptStarted,
    SegmentFailed,
    StepCompleted,
)
from processor.facts.payload import dumps
from processor.facts.topics import TopicName
from processor.transport.deployment import Deployment
from tests.apps.pipelines import ALWAYS_FAILS_ERROR, CALLS, app, expected_steps3_result
from tests.apps.support import decode_records, read_topic, run_facts, wait_until
from tests.kafka.support import FactsWatch, KafkaSpace, assert_replay_verifies

pytestmark = pytest.mark.kafka


@pytest.fixture
def host(space: KafkaSpace, tmp_path: Path) -> Iterator[Host]:
    """A processor with two in-process workers on the test's own Kafka deployment."""
    running = Host(space.deployment(tmp_path / "data"), app, workers=2)
    running.start()
    try:
        _warm_up(running)
        yield running
    finally:
        running.stop()
    assert not running.errors, running.errors


def _warm_up(host: Host) -> None:
    """One run end to end: the workers have joined their group before the test's runs.

    Attempts expire after 6 s (three steps of 2 s); a first join and rebalance of the
    worker group must not eat into the attempts the test counts.
    """
    deployment = host.deployment
    client = Client(deployment.transport, deployment.topology, deployment.settings.state_dir)
    reader = deployment.transport.reader()
    try:
        receipt = client.submit("steps3", {"n": -1}, wait_s=60)
        assert receipt.created is True, receipt
        watch = FactsWatch(reader, deployment.topology)
        wait_until(lambda: watch.all_ended([receipt.run_id]), 60, "the warm-up run to end")
    finally:
        client.close()
        reader.close()


def _of(facts: list[FactHeader], kind: type[Any]) -> list[Any]:
    return [f for f in facts if isinstance(f, kind)]


def _only(facts: list[FactHeader], kind: type[Any]) -> Any:
    found = _of(facts, kind)
    assert len(found) == 1, f"expected one {kind.__name__}, got {found}"
    return found[0]


def _assert_gapless(facts: list[FactHeader]) -> None:
    assert [f.seq for f in facts] == list(range(1, len(facts) + 1))
    assert len({f.fact_key for f in facts}) == len(facts)


def test_runs_succeed_retry_and_fail_on_kafka(
    space: KafkaSpace, host: Host, tmp_path: Path
) -> None:
    deployment: Deployment = host.deployment
    topology = deployment.topology
    client = Client(deployment.transport, topology, deployment.settings.state_dir)
    reader = deployment.transport.reader()
    key = f"flaky-{uuid.uuid4()}"
    succeeding = [new_submit("steps3", {"n": n}) for n in range(20)]
    flaky = new_submit("flaky", {"key": key, "fail_times": 1})
    always_fails = new_submit("always_fails", {"order": 7})
    non_retryable = new_submit("non_retryable", "bad input")
    commands = [*succeeding, flaky, always_fails, non_retryable]
    try:
        for command in commands:
            client.send(command)
        client.flush()
        watch = FactsWatch(reader, topology)
        wait_until(lambda: watch.all_ended(c.run_id for c in commands), 60, "every run to end")
        assert not host.errors, host.errors

        # Runs succeed, each with its result, through exactly one attempt.
        for command in succeeding:
            facts = run_facts(reader, deployment, command.run_id)
            _assert_gapless(facts)
            assert len(_of(facts, SegmentAttemptStarted)) == 1
            assert [s.step for s in _of(facts, StepCompleted)] == [0, 1, 2]
            result = json.loads(_only(facts, RunSucceeded).result)
            assert result == expected_steps3_result(json.loads(command.input)["n"])

        # A transient failure is retried from the failed step, then succeeds.
        facts = run_facts(reader, deployment, flaky.run_id)
        _assert_gapless(facts)
        assert isinstance(facts[-1], RunSucceeded)
        assert _only(facts, SegmentFailed).retryable is True
        assert len(_of(facts, RetryScheduled)) == 1
        assert [s.first_step for s in _of(facts, SegmentAttemptStarted)] == [0, 1]
        assert (CALLS[(key, "prepare")], CALLS[(key, "wobble")], CALLS[(key, "seal")]) == (1, 2, 1)
        assert json.loads(facts[-1].result)["wobbled"] == 2

        # An always-failing step fails the run after its two attempts: RunFailed + dead letter.
        facts = run_facts(reader, deployment, always_fails.run_id)
        _assert_gapless(facts)
        failed = _only(facts, RunFailed)
        assert facts[-1] is failed
        assert (failed.step, failed.attempts, failed.error) == (1, 2, ALWAYS_FAILS_ERROR)
        assert len(_of(facts, SegmentFailed)) == 2
        assert not _of(facts, RunSucceeded)

        # A non-retryable error fails the run at once.
        facts = run_facts(reader, deployment, non_retryable.run_id)
        assert [type(f).__name__ for f in facts] == [
            "RunSubmitted",
            "SegmentAttemptStarted",
            "SegmentFailed",
            "RunFailed",
        ]
        failed = _only(facts, RunFailed)
        assert (failed.attempts, failed.error_type) == (1, "NonRetryableError")

        dead = decode_records(
            read_topic(reader, topology.name(TopicName.DLQ), topology.partitions), DeadLetter
        )
        by_run = {d.run_id: d for d in dead}
        assert len(dead) == len(by_run) == 2
        assert by_run.keys() == {always_fails.run_id, non_retryable.run_id}
        letter = by_run[always_fails.run_id]
        assert (letter.pipeline, letter.step, letter.attempts) == ("always_fails", 1, 2)
        assert (letter.error, letter.error_type) == (ALWAYS_FAILS_ERROR, "RuntimeError")
        assert letter.input == dumps({"order": 7})
        assert by_run[non_retryable.run_id].attempts == 1

        outcomes = decode_records(
            read_topic(reader, topology.name(TopicName.OUTCOMES), topology.partitions),
            RunOutcome,
        )
        status = {o.run_id: o.status for o in outcomes}
        assert len(outcomes) == len(status) == len(commands) + 1  # and the warm-up run
        assert [status[c.run_id] for c in commands] == ["succeeded"] * 21 + ["failed"] * 2
    finally:
        client.close()
        reader.close()

    host.stop()
    report = assert_replay_verifies(space, deployment.settings.data_dir)
    assert report["runs"] == len(commands) + 1


def test_submit_idempotency_on_kafka(space: KafkaSpace, host: Host, tmp_path: Path) -> None:
    data_dir = tmp_path / "cli"  # "another terminal": its own directory, same deployment
    key = f"order-{uuid.uuid4()}"

    def submit(value: str) -> tuple[int, dict[str, Any]]:
        result = space.cli(
            data_dir, "submit", "steps3", "--input", value, "--idempotency-key", key, "--json"
        )
        if result.returncode != 0:  # an error, a refusal too: on stderr
            assert result.stdout == "", result.stdout
            return result.returncode, json.loads(result.stderr)
        return result.returncode, json.loads(result.stdout)

    code, first = submit('{"n": 8}')
    assert (code, first["created"]) == (0, True), first

    # The same fields again (JSON spelled differently): the original run, not created.
    code, again = submit('{ "n" : 8 }')
    assert (code, again) == (0, {"run_id": first["run_id"], "created": False})

    # The same key with a different input is refused.
    code, conflict = submit('{"n": 9}')
    assert code == 1
    assert conflict["refusal"] == "idempotency_conflict"
    assert (conflict["run_id"], conflict["created"]) == (first["run_id"], False)

    # One run, with the first input.
    deployment = host.deployment
    reader = deployment.transport.reader()
    try:
        watch = FactsWatch(reader, deployment.topology)
        wait_until(lambda: watch.all_ended([first["run_id"]]), 60, "the run to end")
        facts = run_facts(reader, deployment, first["run_id"])
    finally:
        reader.close()
    assert json.loads(_only(facts, RunSucceeded).result) == expected_steps3_result(8)
    _assert_gapless(facts)
    host.stop()
    assert_replay_verifies(space, deployment.settings.data_dir)
