"""StepContext, the reporting policy of running attempts, and the offsets a worker commits."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from processor import StepContext
from processor.facts import payload
from processor.facts.models import StopNotice, WorkItem
from processor.model.pipeline_spec import RetryPolicy, StepSpec
from processor.telemetry.logs import RunFields
from processor.telemetry.metrics import STEP_DEADLINE_WARNINGS
from processor.transport.base import Record
from processor.worker.attempts import AttemptRegistry, RunningAttempt
from processor.worker.context import AttemptRef, operation_key, wants_context
from processor.worker.executor import execute
from processor.worker.offsets import PendingOffsets
from processor.worker.pipeline import Application, Pipeline


class Clock:
    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class Reports:
    """A ProgressReporter that keeps what it was told."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int, int, bytes | None]] = []

    def step_started(self, attempt: AttemptRef, step: int, at_ms: int) -> None:
        self.sent.append(("started", step, at_ms, None))

    def heartbeat(self, attempt: AttemptRef, step: int, at_ms: int, details: bytes | None) -> None:
        self.sent.append(("heartbeat", step, at_ms, details))


def item(run_id: str = "run-1", *, attempt: int = 1, kind: str = "forward") -> WorkItem:
    return WorkItem(
        run_id=run_id,
        pipeline="ctx",
        pipeline_version=3,
        segment=0,
        attempt=attempt,
        generation=attempt + 4,
        first_step=0,
        input=payload.dumps({"n": 1}),
        expires_ms=0,
        kind=kind,
        run_deadline_ms=99_000,
    )


def spec(timeout_ms: int = 8_000, heartbeat_ms: int | None = None) -> StepSpec:
    return StepSpec("work", RetryPolicy(), timeout_ms, heartbeat_timeout_ms=heartbeat_ms)


# --- the context -------------------------------------------------------------------------


def test_a_second_positional_parameter_asks_for_the_context() -> None:
    def one(value: Any) -> Any: ...
    def two(value: Any, ctx: StepContext) -> Any: ...
    def star(*args: Any) -> Any: ...
    def keyword_only(value: Any, *, ctx: StepContext | None = None) -> Any: ...
    async def two_async(value: Any, ctx: StepContext) -> Any: ...

    assert not wants_context(one)
    assert wants_context(two)
    assert wants_context(star)
    assert not wants_context(keyword_only)
    assert wants_context(two_async)


def test_the_operation_key_is_per_step_and_run_not_per_attempt() -> None:
    key = operation_key("run-1", 2)
    assert key == operation_key("run-1", 2)
    assert len(key) == 32 and int(key, 16) >= 0
    assert key != operation_key("run-1", 1)
    assert key != operation_key("run-2", 2)
    assert key != operation_key("run-1", 2, "compensate")
    assert operation_key("a|1", 2) != operation_key("a", 12)  # no ambiguity from joining


def test_the_context_logger_names_the_run(caplog: pytest.LogCaptureFixture) -> None:
    ctx = StepContext(
        run_id="run-9", pipeline="p", pipeline_version=1, step="s", step_index=2,
        attempt=3, generation=7,
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="processor.step"):
        ctx.logger.info("hello")
    (record,) = [r for r in caplog.records if r.getMessage() == "hello"]
    assert record.run == RunFields("run-9", "p", 2, 3)  # type: ignore[attr-defined]
    assert not ctx.stop_requested
    ctx.heartbeat({"ignored": True})  # no sink: a no-op


seen: list[StepContext] = []
ctx_pipeline = Pipeline("ctx", version=3)


@ctx_pipeline.step()
def sync_step(value: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    seen.append(ctx)
    return {**value, "sync": ctx.step}


@ctx_pipeline.step()
async def async_step(value: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    await asyncio.sleep(0)
    seen.append(ctx)
    return {**value, "async": ctx.step_index}


@ctx_pipeline.compensate("sync_step")
async def undo(value: dict[str, Any], ctx: StepContext) -> None:
    seen.append(ctx)


APP = Application([ctx_pipeline])


def test_execute_passes_contexts_to_sync_and_async_steps() -> None:
    seen.clear()
    first = execute(item(attempt=1), APP, "w")
    again = execute(item(attempt=2), APP, "w")
    assert first.outcome == again.outcome == "completed"
    assert payload.loads(first.steps[-1].output) == {"n": 1, "sync": "sync_step", "async": 1}
    one, two, three, four = seen
    assert (one.run_id, one.pipeline, one.pipeline_version) == ("run-1", "ctx", 3)
    assert (one.step, one.step_index, one.attempt, one.generation) == ("sync_step", 0, 1, 5)
    assert one.deadline_ms == 99_000
    assert (three.attempt, three.generation) == (2, 6)
    assert one.operation_key == three.operation_key  # the same step, another attempt
    assert two.operation_key == four.operation_key != one.operation_key


def test_an_async_compensator_gets_its_context() -> None:
    seen.clear()
    result = execute(item(kind="compensate"), APP, "w")
    assert result.outcome == "completed"
    (ctx,) = seen
    assert ctx.kind == "compensate"
    assert ctx.operation_key == operation_key("run-1", 0, "compensate")


# --- the reporting policy ----------------------------------------------------------------


def test_a_step_reports_started_only_once_it_has_run_long() -> None:
    clock, reports = Clock(), Reports()
    attempt = RunningAttempt(item(), reports, clock, start_report_after_ms=1_000)
    attempt.step_began(0, spec())
    began = clock.now
    clock.now += 999
    attempt.check(clock.now)
    attempt.heartbeat(b"{}")  # no heartbeat timeout: nothing
    assert reports.sent == []
    clock.now += 1
    attempt.check(clock.now)
    attempt.check(clock.now + 10)
    assert reports.sent == [("started", 0, began + 1_000, None)]


def test_a_fast_step_reports_nothing() -> None:
    clock, reports = Clock(), Reports()
    attempt = RunningAttempt(item(), reports, clock, start_report_after_ms=1_000)
    attempt.step_began(0, spec())
    attempt.step_ended()
    clock.now += 5_000
    attempt.check(clock.now)
    assert reports.sent == []


def test_heartbeats_are_throttled_to_a_quarter_of_the_timeout() -> None:
    clock, reports = Clock(), Reports()
    attempt = RunningAttempt(item(), reports, clock, start_report_after_ms=1_000)
    attempt.step_began(1, spec(heartbeat_ms=4_000))  # started at once: its timer needs it
    began = clock.now
    attempt.heartbeat(b"1")
    clock.now += 999
    attempt.heartbeat(b"2")  # still within the quarter: kept, not sent
    attempt.check(clock.now)
    assert reports.sent == [("started", 1, began, None)]
    clock.now += 1
    attempt.check(clock.now)  # the quarter is over: the latest details go out
    clock.now += 500
    attempt.heartbeat(b"3")
    clock.now += 500
    attempt.heartbeat(b"4")
    assert reports.sent == [
        ("started", 1, began, None),
        ("heartbeat", 1, began + 1_000, b"2"),
        ("heartbeat", 1, began + 2_000, b"4"),
    ]
    attempt.step_ended()
    clock.now += 5_000
    attempt.check(clock.now)
    assert len(reports.sent) == 3


def test_a_deadline_warning_at_75_percent_once(caplog: pytest.LogCaptureFixture) -> None:
    clock, reports = Clock(), Reports()
    attempt = RunningAttempt(item("run-w"), reports, clock, start_report_after_ms=60_000)
    before = STEP_DEADLINE_WARNINGS.labels("ctx", "work")._value.get()
    attempt.step_began(0, spec(timeout_ms=8_000))
    with caplog.at_level(logging.WARNING, logger="processor.worker.attempts"):
        attempt.check(clock.now + 5_999)
        assert not caplog.records
        attempt.check(clock.now + 6_000)
        attempt.check(clock.now + 7_000)
    (record,) = caplog.records
    assert record.event == "deadline_warning"  # type: ignore[attr-defined]
    assert record.run == RunFields("run-w", "ctx", 0, 1)  # type: ignore[attr-defined]
    assert STEP_DEADLINE_WARNINGS.labels("ctx", "work")._value.get() == before + 1


def test_a_stop_notice_sets_the_flag_of_its_attempt_only() -> None:
    registry = AttemptRegistry()
    attempt = RunningAttempt(item(), Reports(), Clock(), start_report_after_ms=1_000)
    registry.add(attempt)
    notice = dict(run_id="run-1", segment=0, generation=5, reason="cancelled", at_ms=1)
    assert not registry.stop(StopNotice(**notice, attempt=2))  # another attempt
    assert not attempt.stop.is_set()
    assert registry.stop(StopNotice(**notice, attempt=1))
    assert attempt.stop.is_set() and attempt.stop.reason == "cancelled"
    registry.remove(attempt)
    assert not registry.stop(StopNotice(**notice, attempt=1))


# --- offsets -----------------------------------------------------------------------------


def rec(offset: int, partition: int = 0) -> Record:
    return Record("work", partition, offset, b"k", b"v")


def test_offsets_commit_only_below_the_oldest_unfinished_record() -> None:
    offsets = PendingOffsets()
    for offset in (5, 6, 7):
        offsets.taken(rec(offset))
    offsets.taken(rec(0, partition=1))
    offsets.finished(rec(6))
    offsets.finished(rec(7))
    offsets.finished(rec(0, partition=1))
    positions = offsets.committable()
    assert {tp.partition: at for tp, at in positions.items()} == {0: 5, 1: 1}
    offsets.committed(positions)
    assert offsets.committable() == {}
    offsets.finished(rec(5))
    assert {tp.partition: at for tp, at in offsets.committable().items()} == {0: 8}
    assert offsets.unfinished() == 0


def test_worker_concurrency_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from processor.config.settings import Settings, default_of

    assert default_of("worker_concurrency") == 8
    assert default_of("start_report_after_ms") == 1_000
    monkeypatch.setenv("PROCESSOR_WORKER_CONCURRENCY", "3")
    assert Settings().worker_concurrency == 3
    monkeypatch.setenv("PROCESSOR_WORKER_CONCURRENCY", "0")
    with pytest.raises(ValueError, match="worker_concurrency"):
        Settings()
