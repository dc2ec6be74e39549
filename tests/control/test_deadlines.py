"""The run deadline: absolute, one durable timer, authoritative over dispatch order."""

from __future__ import annotations

from collections.abc import Callable

from processor.facts.models import (
    RetryScheduled,
    RunStopped,
    RunStopRequested,
    RunSubmitted,
    SegmentAttemptStarted,
    SegmentFailed,
)
from tests.apps.control_pipelines import TIMED_DEADLINE_S
from tests.control.control_support import Control, timers_held

DEADLINE_MS = int(TIMED_DEADLINE_S * 1000)


def test_the_run_deadline_is_stored_absolute_with_one_durable_timer(
    start: Callable[[Control | None], Control],
) -> None:
    ctl = start(None)
    accepted_at = ctl.now
    run_id = ctl.submit("timed", {"id": "d-1"})
    deadline = accepted_at + DEADLINE_MS
    assert ctl.one(run_id, RunSubmitted).deadline_ms == deadline
    assert ctl.state(run_id).deadline_ms == deadline
    assert [e.due_ms for e in ctl.due(run_id) if e.kind == "run_deadline"] == [deadline]

    ctl.until_suspended(run_id)  # time passes, the run moves on: the deadline does not
    ctl.advance_to(accepted_at + DEADLINE_MS // 2)
    ctl.settle()
    assert [e.due_ms for e in ctl.due(run_id) if e.kind == "run_deadline"] == [deadline]

    ctl = start(ctl)  # a restart restores the same absolute deadline, never re-measured
    ctl.drive(lambda: ctl.h.loop_state(run_id) is not None, "the store restored")
    assert ctl.state(run_id).deadline_ms == deadline
    assert [e.due_ms for e in ctl.due(run_id) if e.kind == "run_deadline"] == [deadline]

    ctl.advance_to(deadline - 1)
    ctl.settle()
    assert ctl.of(run_id, RunStopRequested) == []

    ctl.advance_to(deadline)
    stop = ctl.wait_for(run_id, RunStopRequested)[0]
    assert (stop.reason, stop.time_ms) == ("timed_out", deadline)
    assert stop.cause_id.startswith("timer/run_deadline/")
    assert [e for e in ctl.due(run_id) if e.kind == "run_deadline"] == []  # consumed
    ctl.complete(ctl.work(run_id, "compensate"))
    state = ctl.terminal(run_id)
    assert (state.execution, state.recovery) == ("TimedOut", "Compensated")
    assert ctl.due(run_id) == []


def test_a_result_processed_after_the_deadline_commits_timed_out_first_and_no_retry(
    ctl: Control,
) -> None:
    run_id = ctl.submit("timed", {"id": "d-2", "transient": True})
    item = ctl.work(run_id)
    deadline = ctl.state(run_id).deadline_ms
    assert deadline is not None
    with timers_held(ctl.h):  # the result is decided before the deadline timer fires
        result, record = ctl.result(item)  # `hold` raised a retryable error
        assert result.outcome == "failed" and result.retryable
        ctl.advance_to(deadline + 250)
        ctl.consumed(record)
    facts = ctl.facts(run_id)
    types = [type(f).__name__ for f in facts]
    stop = types.index("RunStopRequested")
    assert types[stop:] == ["RunStopRequested", "SegmentFailed", "RunStopped"]
    assert facts[stop].cause_id == result.result_id  # the result itself committed the stop
    assert ctl.one(run_id, RunStopRequested).reason == "timed_out"
    assert ctl.one(run_id, SegmentFailed).retryable is False  # settled, not retryable any more
    assert ctl.of(run_id, RetryScheduled) == []

    ctl.advance_to(deadline + 60_000)  # long past any backoff: still no second attempt
    ctl.settle()
    assert len(ctl.of(run_id, SegmentAttemptStarted)) == 1
    assert ctl.no_new_work(run_id)
    final = ctl.one(run_id, RunStopped)
    assert (final.execution, final.recovery) == ("TimedOut", "NotRequired")
    assert ctl.due(run_id) == []
