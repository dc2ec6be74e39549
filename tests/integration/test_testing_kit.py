"""processor.testing: the kit's clock, not real time, drives every timer of the processor.

Each timeout here is far longer than the test's real duration, and the facts' times
are asserted exactly: with the wall clock behind the processor, neither would hold.
"""

from __future__ import annotations

import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from typing import Any

import pytest

from processor import LocalEnvironment, ManualClock
from processor.errors import WaitTimeoutError
from processor.examples.demo import app as demo_app
from processor.facts.models import (
    BoundaryCompletionAdmitted,
    RetryScheduled,
    RunSubmitted,
    RunSucceeded,
    SegmentAttemptStarted,
    SegmentFailed,
)
from processor.model.pipeline_spec import RetryPolicy
from processor.worker.pipeline import Application, Pipeline
from tests.apps.support import wait_until

START = 1_800_000_000_000
STEP_TIMEOUT_S = 600.0  # ten minutes: only the kit's clock can get there during a test
BACKOFF_MS = 5_000

_release = threading.Event()
_entered = threading.Event()
_calls: list[int] = []

slow = Pipeline("slow", version=1)


@slow.step(
    timeout_s=STEP_TIMEOUT_S,
    retry=RetryPolicy(max_attempts=2, initial_backoff_ms=BACKOFF_MS, max_backoff_ms=BACKOFF_MS),
)
def hang_once(value: dict[str, Any]) -> dict[str, Any]:
    """The first call blocks until the test releases it; the retry returns at once."""
    _calls.append(1)
    if len(_calls) == 1:
        _entered.set()
        _release.wait(30)
    return {**value, "calls": len(_calls)}


approval = Pipeline("approval", version=1)


@approval.await_step(target="approver", timeout_s=24 * 3600)
def ask(value: dict[str, Any]) -> dict[str, Any]:
    return value


kit_app = Application([slow, approval])


@pytest.fixture
def env() -> Iterator[LocalEnvironment]:
    with LocalEnvironment(kit_app, start_ms=START) as environment:
        yield environment


def test_the_clock_only_moves_forward() -> None:
    clock = ManualClock(100)
    assert clock.advance(0) == 100
    assert clock.advance(50) == 150
    with pytest.raises(ValueError, match="forward"):
        clock.advance(-1)
    assert clock() == 150


def test_advance_refuses_to_go_back(env: LocalEnvironment) -> None:
    with pytest.raises(ValueError, match="forward"):
        env.advance(-0.001)
    assert env.now_ms == START


def test_the_example_await_completed_through_the_kit() -> None:
    with LocalEnvironment(demo_app, start_ms=START) as env:
        order_id = "o-2"  # reserve_stock does not fail on it (crc32 % 5 != 0)
        run_id = env.submit("orders", {"order_id": order_id, "amount": 10})
        [request] = env.wait_pending(run_id, target="payments")
        assert request.token and request.kind and request.deadline_ms == START + 30_000
        env.complete(request, {"order_id": order_id, "amount": 12.0, "payment_id": "pay-1"})
        result = env.wait(run_id)
        assert result.succeeded, result
        assert result.output == {
            "order_id": order_id,
            "total": 12.0,
            "payment_id": "pay-1",
            "status": "invoiced",
        }
        history = env.history(run_id)
        assert isinstance(history[0], RunSubmitted) and isinstance(history[-1], RunSucceeded)
        assert any(isinstance(f, BoundaryCompletionAdmitted) for f in history)
        assert {f.time_ms for f in history} == {START}  # the clock never moved
        assert env.history_dicts(run_id)[0]["type"] == "RunSubmitted"
        assert env.pending(run_id) == []


def test_a_retry_backoff_waits_for_the_clock() -> None:
    with LocalEnvironment(demo_app, start_ms=START) as env:
        order_id = _failing_order_id()
        run_id = env.submit("orders", {"order_id": order_id, "amount": 10})
        scheduled = env.wait_fact(run_id, RetryScheduled)
        assert scheduled.due_ms == START + 20  # the demo's 20 ms backoff
        stored = env.client.stored_status(run_id)  # what pending() reads has it too
        assert stored is not None and stored.version >= scheduled.seq
        env.settle()
        assert env.pending(run_id) == []  # the retry is not due: the await did not open
        with pytest.raises(TimeoutError):  # real time passes; the processor's does not
            env.wait_fact(run_id, SegmentAttemptStarted, count=2, timeout_s=0.2)
        env.advance(0.02)
        retried = env.wait_fact(run_id, SegmentAttemptStarted, count=2)
        assert retried.attempt == 2 and retried.time_ms == START + 20
        env.wait_pending(run_id)
        env.complete(run_id, {"order_id": order_id, "amount": 12.0, "payment_id": "p"})
        assert env.wait(run_id).succeeded


def _failing_order_id() -> str:
    """An order id the demo's reserve_stock fails once on (crc32 % 5 == 0)."""
    while True:
        order_id = f"o-{uuid.uuid4().hex[:8]}"
        if zlib.crc32(order_id.encode()) % 5 == 0:
            return order_id


def _started(env: LocalEnvironment, run_id: str) -> None:
    """Wait until the processor has the worker's start report (the kit's workers send
    it as a step starts): the attempt's timeout runs from it."""
    wait_until(
        lambda: (s := env.status(run_id)) is not None and s.attempt.started_step is not None,
        10,
        "the start report",
    )


def test_an_attempt_timeout_fires_at_the_advanced_time(env: LocalEnvironment) -> None:
    _calls.clear()
    _entered.clear()
    _release.clear()
    run_id = env.submit("slow", {"n": 1})
    assert _entered.wait(10), "the first attempt did not start"
    _started(env, run_id)
    env.settle()
    assert not any(isinstance(f, SegmentFailed) for f in env.history(run_id))
    try:
        env.advance(STEP_TIMEOUT_S - 1)  # one second short of the timeout: nothing fires
        assert not any(isinstance(f, SegmentFailed) for f in env.history(run_id))
        env.advance(1)
        # advance returns after the processor fired the timer: the fact is there, no wait
        [failed] = [f for f in env.history(run_id) if isinstance(f, SegmentFailed)]
        assert failed.error_type == "attempt_timeout"
        assert failed.time_ms == START + int(STEP_TIMEOUT_S * 1000)
        scheduled = env.wait_fact(run_id, RetryScheduled)
        assert scheduled.due_ms == failed.time_ms + BACKOFF_MS
        env.advance(BACKOFF_MS / 1000)
        second = env.wait_fact(run_id, SegmentAttemptStarted, count=2)
        assert second.attempt == 2 and second.time_ms == scheduled.due_ms
    finally:
        _release.set()  # the first attempt returns late; its result is stale
    result = env.wait(run_id)
    assert result.succeeded and result.output == {"n": 1, "calls": 2}


def test_a_run_deadline_passed_with_advance_times_the_run_out(env: LocalEnvironment) -> None:
    run_id = env.submit("approval", {"ask": "leave"}, deadline_s=300)
    env.wait_pending(run_id, target="approver")
    env.advance(299)
    with pytest.raises(WaitTimeoutError):
        env.wait(run_id, timeout_s=0.2)
    env.advance(1)
    result = env.wait(run_id, timeout_s=0)  # advance returned after the deadline fired
    assert result.status == "timed_out", result
    history = env.history(run_id)
    assert history[-1].time_ms == START + 300_000
    stops = [f for f in env.history_dicts(run_id) if f["type"] == "RunStopRequested"]
    assert [(f["reason"], f["time_ms"]) for f in stops] == [("timed_out", START + 300_000)]
    assert env.pending(run_id) == []


def test_an_await_failed_through_the_kit_fails_the_run(env: LocalEnvironment) -> None:
    run_id = env.submit("approval", {"ask": "budget"})
    env.fail(run_id, "rejected by the approver")
    result = env.wait(run_id)
    assert result.status == "failed" and "rejected by the approver" in (result.error or "")
    with pytest.raises(AssertionError, match="ended"):
        env.wait_pending(run_id, timeout_s=1)  # a run that ended has no request to wait for


def test_wait_returns_once_the_stores_hold_the_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The end is visible once the transaction commits; the stores that ``pending`` reads
    are written just after. ``wait`` returns once they are, so ``pending`` agrees."""
    from processor.engine.loop import ProcessorLoop

    flush = ProcessorLoop._flush
    ended = threading.Event()

    def late_flush(loop: ProcessorLoop, produced: Any) -> dict[int, int]:
        if ended.is_set():
            time.sleep(0.5)  # the window between a commit and its store write, held open
        return flush(loop, produced)

    monkeypatch.setattr(ProcessorLoop, "_flush", late_flush)
    with LocalEnvironment(kit_app, start_ms=START) as env:
        run_id = env.submit("approval", {"ask": "budget"})
        request = env.wait_pending(run_id)[0]
        ended.set()
        env.fail(request, "rejected by the approver")
        assert env.wait(run_id).status == "failed"
        assert env.pending(run_id) == []
        with pytest.raises(AssertionError, match="ended"):
            env.wait_pending(run_id, timeout_s=1)
