"""Retries, terminal failures and lost attempts.

Most tests drive ``ProcessorLoop.run_once`` by hand with an injected fake clock
and play the worker themselves, so every timer fires at an exact, chosen time
and nothing depends on wall-clock speed. The last test runs the same scenarios
through a real in-process Host with worker threads.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from processor.clients.client import Client, new_submit
from processor.config.settings import Settings
from processor.engine.host import Host
from processor.facts.models import (
    DeadLetter,
    FactHeader,
    RetryScheduled,
    RunFailed,
    RunOutcome,
    RunSubmitted,
    RunSucceeded,
    SegmentAttemptStarted,
    SegmentFailed,
    StepCompleted,
)
from processor.facts.payload import dumps
from processor.facts.topics import TopicName
from processor.model.attempts import NO_EXPIRY
from processor.transport.deployment import Deployment
from tests.apps.pipelines import ALWAYS_FAILS_ERROR, CALLS, app, expected_steps3_result
from tests.apps.support import (
    LoopHarness,
    decode_records,
    read_topic,
    run_facts,
    wait_until,
)


def _only(facts: list[FactHeader], kind: type[Any]) -> Any:
    found = [f for f in facts if isinstance(f, kind)]
    assert len(found) == 1, f"expected one {kind.__name__}, got {found}"
    return found[0]


def _of(facts: list[FactHeader], kind: type[Any]) -> list[Any]:
    return [f for f in facts if isinstance(f, kind)]


def _has(harness: LoopHarness, run_id: str, kind: type[Any]) -> bool:
    return any(isinstance(f, kind) for f in harness.facts(run_id))


def _dead_letters(harness: LoopHarness, run_id: str) -> list[DeadLetter]:
    topology = harness.deployment.topology
    records = read_topic(harness.reader, topology.name(TopicName.DLQ), topology.partitions)
    return [d for d in decode_records(records, DeadLetter) if d.run_id == run_id]


def _outcomes(harness: LoopHarness, run_id: str) -> list[RunOutcome]:
    topology = harness.deployment.topology
    records = read_topic(harness.reader, topology.name(TopicName.OUTCOMES), topology.partitions)
    return [o for o in decode_records(records, RunOutcome) if o.run_id == run_id]


def _assert_gapless(facts: list[FactHeader]) -> None:
    assert [f.seq for f in facts] == list(range(1, len(facts) + 1))
    assert len({f.fact_key for f in facts}) == len(facts)


def test_transient_failure_is_retried_from_the_failed_step(harness: LoopHarness) -> None:
    key = f"flaky-{uuid.uuid4()}"
    run_id = harness.submit("flaky", {"key": key, "fail_times": 1})
    (first,) = harness.drive(harness.new_work, "the first attempt is dispatched")
    assert (first.attempt, first.generation, first.first_step) == (1, 1, 0)

    harness.complete(first)  # `prepare` succeeds, then `wobble` raises
    harness.drive(lambda: _has(harness, run_id, RetryScheduled), "a retry is scheduled")
    facts = harness.facts(run_id)
    failed = _only(facts, SegmentFailed)
    assert (failed.step, failed.generation, failed.retryable) == (1, 1, True)
    assert failed.error_type == "TransientError"
    retry = _only(facts, RetryScheduled)
    assert retry.attempt == 2
    assert retry.due_ms == harness.clock.now_ms + 50  # initial_backoff_ms of `wobble`

    # One millisecond before the backoff ends the timer does not fire.
    harness.clock.advance_to(retry.due_ms - 1)
    harness.loop.run_once()
    harness.loop.run_once()
    assert harness.new_work() == []
    assert len(harness.facts(run_id)) == len(facts)

    harness.clock.advance_to(retry.due_ms)
    (second,) = harness.drive(harness.new_work, "the retry is dispatched")
    assert (second.attempt, second.generation, second.first_step) == (2, 2, 1)
    prepared = _only(facts, StepCompleted)
    assert prepared.step == 0
    assert second.input == prepared.output  # resumes from step 0's recorded output

    harness.complete(second)
    harness.drive(lambda: _has(harness, run_id, RunSucceeded), "the run succeeds")
    facts = harness.facts(run_id)
    assert [type(f).__name__ for f in facts] == [
        "RunSubmitted",
        "SegmentAttemptStarted",
        "StepCompleted",
        "SegmentFailed",
        "RetryScheduled",
        "SegmentAttemptStarted",
        "StepCompleted",
        "StepCompleted",
        "SegmentCompleted",
        "RunSucceeded",
    ]
    started = _of(facts, SegmentAttemptStarted)
    assert [(s.generation, s.first_step) for s in started] == [(1, 0), (2, 1)]
    assert [s.step for s in _of(facts, StepCompleted)] == [0, 1, 2]
    _assert_gapless(facts)
    # The step completed before the failure ran once; the failed step twice.
    assert CALLS[(key, "prepare")] == 1
    assert CALLS[(key, "wobble")] == 2
    assert CALLS[(key, "seal")] == 1
    result = json.loads(_only(facts, RunSucceeded).result)
    assert result == {"key": key, "fail_times": 1, "prepared": True, "wobbled": 2, "sealed": True}


def test_always_failing_step_fails_the_run_after_max_attempts(harness: LoopHarness) -> None:
    run_input = {"order": 7}
    run_id = harness.submit("always_fails", run_input)
    (first,) = harness.drive(harness.new_work, "the first attempt is dispatched")
    harness.complete(first)
    harness.drive(lambda: _has(harness, run_id, RetryScheduled), "a retry is scheduled")
    retry = _only(harness.facts(run_id), RetryScheduled)

    harness.clock.advance_to(retry.due_ms)
    (second,) = harness.drive(harness.new_work, "the second attempt is dispatched")
    assert (second.attempt, second.generation, second.first_step) == (2, 2, 1)
    harness.complete(second)
    harness.drive(lambda: _has(harness, run_id, RunFailed), "the run fails")

    facts = harness.facts(run_id)
    failed = _only(facts, RunFailed)
    assert (failed.step, failed.attempts) == (1, 2)
    assert failed.error == ALWAYS_FAILS_ERROR
    assert failed.error_type == "RuntimeError"
    assert len(_of(facts, SegmentFailed)) == 2
    assert len(_of(facts, RetryScheduled)) == 1
    assert not _of(facts, RunSucceeded)
    _assert_gapless(facts)

    (dead,) = _dead_letters(harness, run_id)
    assert (dead.pipeline, dead.pipeline_version, dead.step) == ("always_fails", 1, 1)
    assert (dead.attempts, dead.error, dead.error_type) == (2, ALWAYS_FAILS_ERROR, "RuntimeError")
    assert dead.input == dumps(run_input)
    (outcome,) = _outcomes(harness, run_id)
    assert (outcome.status, outcome.error) == ("failed", ALWAYS_FAILS_ERROR)

    # A failed run is over: much later, nothing is dispatched and no fact is added.
    harness.clock.advance_to(harness.clock.now_ms + 3_600_000)
    harness.loop.run_once()
    harness.loop.run_once()
    assert harness.new_work() == []
    assert len(harness.facts(run_id)) == len(facts)


def test_non_retryable_error_fails_at_once(harness: LoopHarness) -> None:
    run_id = harness.submit("non_retryable", "bad input")
    (item,) = harness.drive(harness.new_work, "the attempt is dispatched")
    harness.complete(item)
    harness.drive(lambda: _has(harness, run_id, RunFailed), "the run fails")

    facts = harness.facts(run_id)
    assert [type(f).__name__ for f in facts] == [
        "RunSubmitted",
        "SegmentAttemptStarted",
        "SegmentFailed",
        "RunFailed",
    ]
    segment_failed = _only(facts, SegmentFailed)
    assert segment_failed.retryable is False
    failed = _only(facts, RunFailed)
    assert (failed.attempts, failed.step, failed.error_type) == (1, 0, "NonRetryableError")
    assert "can never succeed" in failed.error
    (dead,) = _dead_letters(harness, run_id)
    assert (dead.attempts, dead.error_type) == (1, "NonRetryableError")
    assert dead.error == failed.error


def test_lost_attempt_gets_a_new_attempt_after_its_timeout(harness: LoopHarness) -> None:
    run_id = harness.submit("steps3", {"n": 21})
    (lost,) = harness.drive(harness.new_work, "the first attempt is dispatched")
    started = _only(harness.facts(run_id), SegmentAttemptStarted)
    assert started.expires_ms is None and lost.expires_ms == NO_EXPIRY  # queued: no timer

    # Queued far longer than its timeout: nothing happens until a worker starts it.
    harness.clock.advance_to(harness.clock.now_ms + 60_000)
    harness.loop.run_once()
    harness.loop.run_once()
    assert not _has(harness, run_id, SegmentFailed)
    expires_ms = harness.started(lost)
    assert expires_ms == harness.clock.now_ms + 3 * 2_000  # three steps of 2 s, from the start

    # No worker ever answers. Just before the deadline nothing happens...
    harness.clock.advance_to(expires_ms - 1)
    harness.loop.run_once()
    harness.loop.run_once()
    assert not _has(harness, run_id, SegmentFailed)

    # ...at the deadline the attempt counts as lost and a retry is scheduled.
    harness.clock.advance_to(expires_ms)
    harness.drive(lambda: _has(harness, run_id, RetryScheduled), "the lost attempt is retried")
    facts = harness.facts(run_id)
    timed_out = _only(facts, SegmentFailed)
    assert (timed_out.error_type, timed_out.step, timed_out.retryable) == (
        "attempt_timeout",
        0,
        True,
    )
    retry = _only(facts, RetryScheduled)

    harness.clock.advance_to(retry.due_ms)
    (fresh,) = harness.drive(harness.new_work, "a new attempt is dispatched")
    assert (fresh.attempt, fresh.generation, fresh.first_step) == (2, 2, 0)
    second_start = _of(harness.facts(run_id), SegmentAttemptStarted)[-1]
    assert second_start.expires_ms is None

    # The lost worker wakes up and reports: its result is stale and changes nothing.
    before = harness.facts(run_id)
    late = harness.complete(lost)
    rejected = harness.drive(lambda: harness.rejected.find(late), "the late result is refused")
    assert rejected.reason == "stale_attempt"
    assert rejected.run_id == run_id
    assert harness.facts(run_id) == before

    harness.complete(fresh)
    harness.drive(lambda: _has(harness, run_id, RunSucceeded), "the run succeeds")
    facts = harness.facts(run_id)
    assert json.loads(_only(facts, RunSucceeded).result) == expected_steps3_result(21)
    _assert_gapless(facts)


def test_attempts_lost_until_the_budget_is_spent_fail_the_run(harness: LoopHarness) -> None:
    key = f"lost-{uuid.uuid4()}"
    run_id = harness.submit("flaky", {"key": key})
    for attempt in (1, 2, 3):  # the flaky pipeline allows 3 attempts per step
        (item,) = harness.drive(harness.new_work, f"attempt {attempt} is dispatched")
        assert (item.attempt, item.generation) == (attempt, attempt)
        harness.clock.advance_to(harness.started(item))
        if attempt < 3:
            harness.drive(
                lambda a=attempt: len(_of(harness.facts(run_id), RetryScheduled)) == a,
                f"attempt {attempt} is retried",
            )
            retry = _of(harness.facts(run_id), RetryScheduled)[-1]
            harness.clock.advance_to(retry.due_ms)
    harness.drive(lambda: _has(harness, run_id, RunFailed), "the run fails")
    facts = harness.facts(run_id)
    failed = _only(facts, RunFailed)
    assert (failed.attempts, failed.error_type, failed.step) == (3, "attempt_timeout", 0)
    assert len(_of(facts, SegmentFailed)) == 3
    assert CALLS[(key, "prepare")] == 0  # no worker ever ran it
    (dead,) = _dead_letters(harness, run_id)
    assert (dead.attempts, dead.error_type) == (3, "attempt_timeout")


def test_retries_end_to_end_with_in_process_workers(tmp_path: Path) -> None:
    deployment = Deployment.from_settings(Settings(data_dir=tmp_path / "data"))
    host = Host(deployment, app, workers=2)
    host.start()
    client = Client(deployment.transport, deployment.topology, deployment.settings.state_dir)
    reader = deployment.transport.reader()
    try:
        key = f"e2e-{uuid.uuid4()}"
        commands = {
            "flaky": new_submit("flaky", {"key": key, "fail_times": 2}),
            "always_fails": new_submit("always_fails", {"x": 1}),
            "non_retryable": new_submit("non_retryable", {"x": 2}),
        }
        for command in commands.values():
            client.send(command)
        client.flush()

        def terminal() -> dict[str, FactHeader] | None:
            found = {}
            for name, command in commands.items():
                ends = [
                    f
                    for f in run_facts(reader, deployment, command.run_id)
                    if isinstance(f, RunSucceeded | RunFailed)
                ]
                if not ends:
                    return None
                found[name] = ends[-1]
            return found

        ends = wait_until(terminal, 60, "every run to end")
        assert not host.errors
    finally:
        host.stop()
        client.close()

    assert isinstance(ends["flaky"], RunSucceeded)
    assert json.loads(ends["flaky"].result)["wobbled"] == 3
    assert CALLS[(key, "prepare")] == 1
    assert CALLS[(key, "wobble")] == 3
    flaky_facts = run_facts(reader, deployment, commands["flaky"].run_id)
    assert [s.first_step for s in _of(flaky_facts, SegmentAttemptStarted)] == [0, 1, 1]
    assert isinstance(flaky_facts[0], RunSubmitted)
    _assert_gapless(flaky_facts)

    assert isinstance(ends["always_fails"], RunFailed)
    assert ends["always_fails"].attempts == 2
    assert isinstance(ends["non_retryable"], RunFailed)
    assert ends["non_retryable"].attempts == 1
    topology = deployment.topology
    dlq = decode_records(
        read_topic(reader, topology.name(TopicName.DLQ), topology.partitions), DeadLetter
    )
    reader.close()
    assert sorted((d.pipeline, d.attempts) for d in dlq) == [
        ("always_fails", 2),
        ("non_retryable", 1),
    ]
