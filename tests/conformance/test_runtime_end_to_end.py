"""The step runtime end to end: a real processor loop and real workers (``Host``) on
each transport, the wall clock, short timeouts.

The per-feature tests drive one side and play the other (``tests/control`` produces
AttemptProgress by hand, ``test_worker_runtime`` has no processor). Here the worker's
start reports, heartbeats and results reach the processor's timers, and the
processor's stop notices reach the running step. Timings are read from the facts'
``time_ms`` (the processor's clock when it decided them); waits have deadlines.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from processor.clients.client import Client, new_submit
from processor.clients.outcome import RunResult, terminal_result
from processor.config.settings import Settings
from processor.engine.host import Host
from processor.facts import payload
from processor.facts.codec import decode_fact
from processor.facts.models import (
    AttemptHeartbeatRecorded,
    AttemptLost,
    AttemptOutcomeUnknown,
    AttemptStepStarted,
    FactHeader,
    RetryScheduled,
    RunSubmitted,
    SegmentAttemptStarted,
    SegmentFailed,
)
from processor.facts.topics import TopicName
from processor.telemetry.metrics import STEP_DEADLINE_WARNINGS
from processor.transport.deployment import Deployment
from tests.apps import runtime_pipelines as rp
from tests.apps.support import TopicTail, wait_until

WAIT_S = 20.0
F = TypeVar("F", bound=FactHeader)


@dataclass
class Stack:
    """A running Host and a client of its deployment."""

    host: Host
    client: Client

    def submit(self, pipeline: str, value: Any, *, deadline_s: float | None = None) -> str:
        receipt = self.client.submit(pipeline, value, deadline_s=deadline_s, wait_s=WAIT_S)
        assert receipt.created is True, receipt
        return receipt.run_id

    def wait(self, run_id: str, timeout_s: float = WAIT_S) -> RunResult:
        return self.client.wait(run_id, timeout_s)

    def of(self, run_id: str, kind: type[F]) -> list[F]:
        return [f for f in self.client.history(run_id) if isinstance(f, kind)]

    def wait_for(self, run_id: str, kind: type[F]) -> F:
        found = wait_until(lambda: self.of(run_id, kind), WAIT_S, f"{kind.__name__} of {run_id}")
        return found[0]

    def check(self) -> None:
        assert not self.host.errors, self.host.errors


def _settings(kind: str, data_dir: Path) -> tuple[Settings, Callable[[], None]]:
    """Settings of a fresh deployment, and how to clean up after it."""
    # Every step reports its start at once, so every attempt runs on a timer.
    fast = {"timer_interval_ms": 20, "start_report_after_ms": 0, "partitions": 1}
    if kind == "embedded":
        return Settings(broker=None, data_dir=data_dir, **fast), lambda: None
    from tests.kafka.support import KafkaSpace
    from tests.kafka_broker import kafka_bootstrap, unavailable_reason

    bootstrap = kafka_bootstrap()
    if bootstrap is None:
        pytest.skip(unavailable_reason())
    space = KafkaSpace.new(bootstrap, partitions=1)
    return space.settings(data_dir).model_copy(update=fast), space.delete_topics


@contextmanager
def running(kind: str, data_dir: Path, *, concurrency: int) -> Iterator[Stack]:
    """A processor and one worker of ``concurrency`` slots; a first run has gone through
    (partitions assigned, the worker in its group) when it yields."""
    settings, clean_up = _settings(kind, data_dir)
    deployment = Deployment.from_settings(settings)
    host = Host(deployment, rp.app, workers=1, concurrency=concurrency)
    host.start()
    client = Client(deployment.transport, deployment.topology, settings.state_dir)
    stack = Stack(host, client)
    try:
        warm_up = stack.submit("e2e_quick", {"warm": True})
        assert stack.wait(warm_up, 60).status == "succeeded"
        yield stack
    finally:
        rp.RELEASE.set()  # hanging steps return: the worker can stop
        client.close()
        host.stop()
        clean_up()
    stack.check()


@pytest.fixture(scope="module", params=["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def shared(kind: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One processor and a worker of four slots for the module's tests (on Kafka, joining
    groups costs seconds); each test uses runs of its own."""
    with running(kind, tmp_path_factory.mktemp("e2e"), concurrency=4) as stack:
        yield stack


@pytest.fixture
def stack(shared: Stack) -> Iterator[Stack]:
    rp.RELEASE.clear()
    try:
        yield shared
    finally:
        rp.RELEASE.set()  # this test's hanging steps return and free their slots
        shared.check()


def _id() -> str:
    return uuid.uuid4().hex[:12]


def test_a_step_that_stops_heartbeating_is_retried_within_its_heartbeat_timeout(
    stack: Stack,
) -> None:
    value = {"id": _id()}
    began = time.monotonic()
    run_id = stack.submit("e2e_beating", value)
    result = stack.wait(run_id)
    elapsed = time.monotonic() - began
    assert result.status == "succeeded", result
    assert result.output["generation"] == 2
    assert elapsed < rp.LONG_TIMEOUT_S / 2, elapsed

    started = stack.of(run_id, AttemptStepStarted)
    beats = stack.of(run_id, AttemptHeartbeatRecorded)
    (lost,) = stack.of(run_id, AttemptLost)
    assert [s.generation for s in started] == [1, 2]
    assert beats and all(b.generation == 1 for b in beats)  # the real worker's heartbeats
    assert (lost.cause, lost.generation, lost.losses) == ("heartbeat_timeout", 1, 1)
    # Lost a heartbeat timeout after the last recorded heartbeat, long before its timeout.
    silence_ms = lost.time_ms - beats[-1].time_ms
    timeout_ms = int(rp.BEAT_TIMEOUT_S * 1000)
    assert timeout_ms <= silence_ms < timeout_ms + 2_000, silence_ms
    assert lost.time_ms - started[0].time_ms < rp.LONG_TIMEOUT_S * 1000 / 4
    # One attempt allowed: the loss was not charged to it.
    assert not stack.of(run_id, SegmentFailed)
    state = stack.client.status(run_id)
    assert state is not None and state.infrastructure_losses == 1
    first, retry = rp.SEEN[value["id"]]
    assert (first["generation"], retry["generation"]) == (1, 2)
    assert first["operation_key"] == retry["operation_key"]


def test_graph_branches_heartbeat_in_their_own_lanes(stack: Stack) -> None:
    """Two branches of a graph run, each with a heartbeat timeout: ``steady`` heartbeats
    for twice its heartbeat timeout and is never lost; ``falls_silent`` stops
    heartbeating and its lane alone is lost and retried (generation 2); the join gets
    both."""
    value = {"id": _id()}
    run_id = stack.submit("e2e_branches", value)
    result = stack.wait(run_id)
    assert result.status == "succeeded", result
    assert result.output == {
        "falls_silent": {"id": value["id"], "generation": 2},
        "steady": {"steady": 1},
    }
    steps = [s.spec.name for s in rp.branches.steps]
    lane = {f.first_step: f.segment for f in stack.of(run_id, SegmentAttemptStarted)}
    steady, silent = lane[steps.index("steady")], lane[steps.index("falls_silent")]
    beats = stack.of(run_id, AttemptHeartbeatRecorded)
    steady_beats = [b for b in beats if b.segment == steady]
    assert steady_beats and all(b.generation == 1 for b in steady_beats)
    started = {s.segment: s.time_ms for s in stack.of(run_id, AttemptStepStarted)}
    # heartbeats recorded past its heartbeat timeout: without them it would be lost
    assert steady_beats[-1].time_ms - started[steady] > int(rp.BEAT_TIMEOUT_S * 1000)
    (lost,) = stack.of(run_id, AttemptLost)
    assert (lost.segment, lost.cause, lost.generation) == (silent, "heartbeat_timeout", 1)
    silent_beats = [b for b in beats if b.segment == silent]
    assert silent_beats and all(b.generation == 1 for b in silent_beats)
    timeout_ms = int(rp.BEAT_TIMEOUT_S * 1000)
    silence_ms = lost.time_ms - silent_beats[-1].time_ms
    assert timeout_ms <= silence_ms < timeout_ms + 2_000, silence_ms
    assert not stack.of(run_id, SegmentFailed)


def test_fifty_runs_queued_behind_one_busy_worker_all_succeed(kind: str, tmp_path: Path) -> None:
    """One worker, one slot: the last runs wait in the queue for much longer than their
    effectful step's timeout; none is lost, Unknown or failed."""
    with running(kind, tmp_path, concurrency=1) as busy:
        commands = [new_submit("e2e_queued", {"id": f"q{n}-{_id()}"}) for n in range(50)]
        for command in commands:
            busy.client.send(command)
        busy.client.flush()
        wanted = {command.run_id for command in commands}
        facts = _follow_until_ended(busy, wanted)
    for run_id in wanted:
        ended = terminal_result(facts[run_id])
        assert ended is not None and ended.status == "succeeded", ended
        assert ended.output == {"paid": _input_id(facts[run_id])}
        kinds = {type(f) for f in facts[run_id]}
        assert not kinds & {AttemptLost, AttemptOutcomeUnknown, SegmentFailed, RetryScheduled}
    queued_ms = max(_queued_ms(facts[run_id]) for run_id in wanted)
    assert queued_ms > rp.QUEUED_TIMEOUT_S * 1000, f"no run queued long enough: {queued_ms}"


def _follow_until_ended(stack: Stack, run_ids: set[str]) -> dict[str, list[FactHeader]]:
    """Every fact of ``run_ids``, read from runs.facts until each run ended."""
    deployment = stack.host.deployment
    topology = deployment.topology
    reader = deployment.transport.reader()
    facts: dict[str, list[FactHeader]] = {run_id: [] for run_id in run_ids}
    tail = TopicTail(reader, topology.name(TopicName.FACTS), topology.partitions)

    def all_ended() -> bool:
        for record in tail.new():
            fact = decode_fact(record.value)
            if fact.run_id in facts:
                facts[fact.run_id].append(fact)
        return all(terminal_result(found) is not None for found in facts.values())

    try:
        wait_until(all_ended, 60, "fifty queued runs to end", max_pause_s=0.2)
    finally:
        reader.close()
    return facts


def _input_id(facts: list[FactHeader]) -> str:
    (submitted,) = (f for f in facts if isinstance(f, RunSubmitted))
    return str(payload.loads(submitted.input)["id"])


def _queued_ms(facts: list[FactHeader]) -> int:
    """From the dispatch of the run's attempt to the worker's start report."""
    (dispatched,) = (f for f in facts if isinstance(f, SegmentAttemptStarted))
    (started,) = (f for f in facts if isinstance(f, AttemptStepStarted))
    return started.time_ms - dispatched.time_ms


def test_a_cancel_reaches_the_running_step_and_the_run_ends_cancelled(stack: Stack) -> None:
    value = {"id": _id()}
    run_id = stack.submit("e2e_cancellable", value)
    seen = rp.SEEN[value["id"]]
    wait_until(lambda: seen, WAIT_S, "the step to start")
    cancelled_at = time.monotonic()
    reply = stack.client.cancel(run_id, "the customer changed their mind", wait_s=WAIT_S)
    assert reply is not None and not reply.refusal, reply
    result = stack.wait(run_id)
    assert result.status == "cancelled", result
    started, stopped = seen
    assert (started["event"], stopped["event"]) == ("started", "stopped")
    assert stopped["stop_requested"] is True  # the processor's StopNotice reached the step
    assert stopped["at"] - cancelled_at < WAIT_S / 2


def test_an_effectful_step_is_unknown_after_its_own_timeout(stack: Stack) -> None:
    value = {"id": _id()}
    run_id = stack.submit("e2e_effectful", value)
    unknown = stack.wait_for(run_id, AttemptOutcomeUnknown)
    (started,) = stack.of(run_id, AttemptStepStarted)
    assert (unknown.step, unknown.generation) == (0, started.generation)
    own_ms = int(rp.CHARGE_TIMEOUT_S * 1000)
    assert started.expires_ms == started.time_ms + own_ms  # not charge + ship
    assert own_ms <= unknown.time_ms - started.time_ms < own_ms + 2_000
    state = stack.client.status(run_id)
    assert state is not None and state.unknown is not None and not state.terminal
    assert len(rp.SEEN[value["id"]]) == 1  # never retried blindly


def test_the_context_keeps_its_operation_key_counts_attempts_and_has_the_deadline(
    stack: Stack,
) -> None:
    value = {"id": _id()}
    run_id = stack.submit("e2e_keyed", value, deadline_s=120)
    result = stack.wait(run_id)
    assert result.status == "succeeded", result
    (submitted,) = stack.of(run_id, RunSubmitted)
    assert submitted.deadline_ms is not None
    first, second = rp.SEEN[value["id"]]
    assert (first["attempt"], second["attempt"]) == (1, 2)
    assert first["generation"] < second["generation"]
    assert first["operation_key"] == second["operation_key"] == result.output["key"]
    assert first["run_id"] == second["run_id"] == run_id
    assert first["deadline_ms"] == second["deadline_ms"] == submitted.deadline_ms
    assert first["step"] == "reserve"


def test_a_step_near_its_timeout_gets_a_deadline_warning_and_goes_on(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    counter = STEP_DEADLINE_WARNINGS.labels("e2e_slow", "linger")
    before = counter._value.get()
    run_id = stack.submit("e2e_slow", {"id": _id()})

    def warned() -> list[logging.LogRecord]:
        return [
            r
            for r in caplog.records
            if getattr(r, "event", None) == "deadline_warning" and run_id in r.getMessage()
        ]

    with caplog.at_level(logging.WARNING, logger="processor.worker.attempts"):
        (warning,) = wait_until(warned, WAIT_S, "the deadline warning")
        rp.RELEASE.set()  # the step finishes within its timeout
    assert counter._value.get() == before + 1
    result = stack.wait(run_id)
    assert result.status == "succeeded", result  # a warning, not a failure
    assert not stack.of(run_id, SegmentFailed) and not stack.of(run_id, AttemptOutcomeUnknown)
    assert warning.levelno == logging.WARNING


def test_a_cancel_reaches_a_running_step_with_work_queued_behind_it(
    kind: str, tmp_path: Path
) -> None:
    """One slot, busy with a step that waits for its stop; runs queued behind it on the
    same partition. The stop notice comes after their work items."""
    with running(kind, tmp_path, concurrency=1) as busy:
        rp.RELEASE.clear()
        value = {"id": _id()}
        run_id = busy.submit("e2e_cancellable", value)
        seen = rp.SEEN[value["id"]]
        wait_until(lambda: seen, WAIT_S, "the step to start")
        queued = [busy.submit("e2e_quick", {"n": n}) for n in range(3)]
        reply = busy.client.cancel(run_id, "changed my mind", wait_s=WAIT_S)
        assert reply is not None and not reply.refusal, reply
        try:
            wait_until(lambda: len(seen) == 2, 5.0, "the step to see the stop")
        finally:
            rp.RELEASE.set()
        assert seen[1]["stop_requested"] is True
        assert busy.wait(run_id).status == "cancelled"
        assert all(busy.wait(q).status == "succeeded" for q in queued)
