"""Child runs on both transports: a processor loop driven by hand (``LoopHarness``), a
fake clock, the worker played by the test.

A child step starts runs of another pipeline under ids derived from the parent, step
and item; their outcomes come back through admission; a stale parent attempt or a
redelivered submit starts no second child; a cancelled parent cancels its children
and ends once their outcomes are in;
nesting deeper than the limit is refused with a reason.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from processor.clients.client import new_submit, status_dict
from processor.facts import payload
from processor.facts.models import (
    BoundaryCompletionAdmitted,
    CancelRun,
    ChildRunLinked,
    FactHeader,
    RunSubmitted,
    SegmentFailed,
    SegmentSuspended,
    SubmitRun,
)
from processor.facts.topics import TopicName
from processor.model.children import CHILD_DEPTH_EXCEEDED, MAX_CHILD_DEPTH, child_run_id
from processor.model.state import RunState
from processor.transport.base import TopicPartition
from processor.transport.partitioner import partition_for
from tests.apps.child_pipelines import app
from tests.apps.support import FakeClock, LoopHarness, decode_records, transport_settings

T = TypeVar("T")


@pytest.fixture(scope="module", params=["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def harness(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LoopHarness]:
    settings = transport_settings(str(request.param), tmp_path_factory.mktemp("children"))
    h = LoopHarness(settings.data_dir, app, FakeClock(), settings=settings)
    try:
        yield h
    finally:
        h.close()


def _working(h: LoopHarness, condition: Callable[[], T], what: str) -> T:
    """Drive the loop, running every work item as a worker would, until ``condition``."""

    def step() -> T:
        for item in h.new_work():
            h.complete(item)
        return condition()

    return h.drive(step, what)


def _state(h: LoopHarness, run_id: str) -> RunState | None:
    return h.loop_state(run_id)


def _ended(h: LoopHarness, run_id: str) -> RunState:
    def ended() -> RunState | None:
        state = _state(h, run_id)
        return state if state is not None and state.terminal else None

    return _working(h, ended, f"{run_id} terminal")


def _count(facts: list[FactHeader], kind: type[FactHeader]) -> int:
    return sum(isinstance(f, kind) for f in facts)


def _submits(h: LoopHarness, child: str) -> list[SubmitRun]:
    """The SubmitRun commands of ``child`` on runs.commands."""
    topology = h.deployment.topology
    tp = TopicPartition(
        topology.name(TopicName.COMMANDS), partition_for(child.encode(), topology.partitions)
    )
    records = [r for batch in h.reader.read(tp, 0) for r in batch if r.key == child.encode()]
    commands = [r for r in records if b"child/" in (r.value or b"")]
    return decode_records(commands, SubmitRun)


def _ended_after_a_child_outcome(h: LoopHarness, run_id: str, ending: str = "RunStopped") -> None:
    """The stopped parent waited: a child's outcome was admitted after its stop, and
    only then did it end with ``ending`` (seed 002: no parent ends before its children)."""
    kinds = [type(fact).__name__ for fact in h.facts(run_id)]
    stopped = kinds.index("RunStopRequested")
    admitted = kinds.index("BoundaryCompletionAdmitted", stopped)
    assert kinds.index(ending, admitted) > admitted, kinds


def _unique() -> int:
    return uuid.uuid4().int % 1_000_000


def test_a_child_runs_once_and_its_result_reaches_the_parent(harness: LoopHarness) -> None:
    h, n = harness, _unique()
    run_id = h.submit("parent", n)
    parent = _ended(h, run_id)
    assert parent.status == "succeeded", parent.error
    assert payload.loads(parent.result or b"") == {"got": 2 * n}

    child = child_run_id(run_id, 1, 0)
    kid = _state(h, child)
    assert kid is not None and kid.status == "succeeded"
    assert kid.parent is not None and (kid.parent.run_id, kid.parent.depth) == (run_id, 1)
    facts = h.facts(child)
    assert _count(facts, RunSubmitted) == 1 and _count(facts, ChildRunLinked) == 1
    # Status (CLI, API) links them both ways.
    assert [c["run_id"] for c in status_dict(parent)["children"]] == [child]
    assert status_dict(kid)["parent"] == {"run_id": run_id, "depth": 1}
    assert status_dict(parent)["parent"] is None

    # The submit delivered again starts nothing: the same command, the same child.
    (submit,) = _submits(h, child)
    again = h.produce_model(TopicName.COMMANDS, child, submit)
    h.drive(lambda: h.loop.input_positions.get(again.position, 0) > again.offset, "redelivery")
    assert _count(h.facts(child), RunSubmitted) == 1


def _parent_completions(h: LoopHarness, parent: str) -> list[bytes | None]:
    """The records on runs.completions addressed to ``parent`` (keyed by its run id)."""
    topology = h.deployment.topology
    tp = TopicPartition(
        topology.name(TopicName.COMPLETIONS), partition_for(parent.encode(), topology.partitions)
    )
    return [r.value for batch in h.reader.read(tp, 0) for r in batch if r.key == parent.encode()]


def test_a_childs_outcome_is_admitted_in_the_commit_that_ends_it(harness: LoopHarness) -> None:
    """This loop owns the parent's partition: the child's outcome is admitted in the
    batch that ends the child, with no round trip through runs.completions."""
    h, n = harness, _unique()
    run_id = h.submit("many", [n, n + 1, n + 2])
    parent = _ended(h, run_id)
    assert parent.status == "succeeded", parent.error
    assert payload.loads(parent.result or b"")["items"] == [2 * n, 2 * (n + 1), 2 * (n + 2)]
    admitted = [f for f in h.facts(run_id) if isinstance(f, BoundaryCompletionAdmitted)]
    assert len(admitted) == 3
    assert _parent_completions(h, run_id) == []


def test_a_stale_parent_attempt_starts_no_second_child(harness: LoopHarness) -> None:
    h, n = harness, _unique()
    run_id = h.submit("parent", n)
    (first,) = h.drive(lambda: [i for i in h.new_work() if i.run_id == run_id], "parent work")
    expires_ms = h.started(first)
    h.clock.advance_to(expires_ms)  # the parent's attempt times out and is retried
    (second,) = h.drive(lambda: [i for i in h.new_work() if i.run_id == run_id], "the retry")
    assert second.attempt == 2
    late = h.complete(first)  # the first attempt answers late: refused, no child
    assert h.drive(lambda: h.rejected.find(late), "the late result").reason == "stale_attempt"
    h.complete(second)
    parent = _ended(h, run_id)
    assert parent.status == "succeeded", parent.error
    child = child_run_id(run_id, 1, 0)
    assert len(_submits(h, child)) == 1
    assert _count(h.facts(child), RunSubmitted) == 1


def test_a_fan_out_of_children_keeps_item_order_and_its_tolerance(harness: LoopHarness) -> None:
    h, n = harness, _unique()
    run_id = h.submit("many", [n, "boom", n + 1])
    parent = _ended(h, run_id)
    assert parent.status == "succeeded", parent.error
    output: Any = payload.loads(parent.result or b"")
    assert output["items"] == [2 * n, None, 2 * (n + 1)]
    assert output["failed"][0]["item"] == 1
    assert "the kid failed" in str(output["failed"][0])
    kids = [child_run_id(run_id, 1, item) for item in range(3)]
    assert [(_state(h, k) or parent).status for k in kids] == ["succeeded", "failed", "succeeded"]


def test_cancelling_a_parent_cancels_its_child(harness: LoopHarness) -> None:
    h = harness
    run_id = h.submit("waiting_parent", {"x": _unique()})
    child = child_run_id(run_id, 1, 0)
    _working(h, lambda: h.suspended(child), "the child waits")
    cancel = CancelRun(
        command_id=str(uuid.uuid4()), run_id=run_id, reason="test", requested_ms=h.clock()
    )
    h.produce_model(TopicName.COMMANDS, run_id, cancel)
    assert _ended(h, run_id).status == "cancelled"
    kid = _ended(h, child)
    assert kid.status == "cancelled"
    assert f"parent run {run_id} stopped" in (kid.stop.detail or kid.error or "")
    # The parent waited for its child: the child's outcome was admitted after the stop,
    # and only then did the parent end (seed 002: no parent ends before its children).
    _ended_after_a_child_outcome(h, run_id)


def test_cancelling_a_graph_parent_waits_for_the_child_of_its_lane(harness: LoopHarness) -> None:
    h = harness
    run_id = h.submit("graph_waiting_parent", {"x": _unique()})

    def child_waits() -> str | None:
        parent = _state(h, run_id)
        kids = [] if parent is None else status_dict(parent)["children"]
        return kids[0]["run_id"] if kids and h.suspended(kids[0]["run_id"]) else None

    child = _working(h, child_waits, "the graph's child waits")
    cancel = CancelRun(
        command_id=str(uuid.uuid4()), run_id=run_id, reason="test", requested_ms=h.clock()
    )
    h.produce_model(TopicName.COMMANDS, run_id, cancel)
    assert _ended(h, run_id).status == "cancelled"
    assert _ended(h, child).status == "cancelled"
    _ended_after_a_child_outcome(h, run_id)


def test_a_parent_failed_by_a_child_waits_for_its_other_children(harness: LoopHarness) -> None:
    h = harness
    run_id = h.submit("failing_parent", {"x": _unique()})
    parent = _ended(h, run_id)
    assert parent.status == "failed"
    assert "the kid failed" in (parent.error or ""), parent.error
    waiting = _ended(h, child_run_id(run_id, 1, 1))
    assert waiting.status == "cancelled"
    assert f"parent run {run_id} stopped: failed" in (waiting.stop.detail or "")
    # The failed step cancelled the waiting child, and the parent failed only once that
    # child's outcome was in.
    _ended_after_a_child_outcome(h, run_id, "RunFailed")


def test_nesting_deeper_than_the_limit_is_refused_with_a_reason(harness: LoopHarness) -> None:
    h = harness
    run_id = h.submit("nest", 0)
    root = _ended(h, run_id)
    assert root.status == "failed"
    chain, run = [run_id], run_id
    for _ in range(MAX_CHILD_DEPTH):
        run = child_run_id(run, 1, 0)
        chain.append(run)
    deepest = _state(h, chain[-1])
    assert deepest is not None and deepest.parent is not None
    assert deepest.parent.depth == MAX_CHILD_DEPTH
    assert _state(h, child_run_id(chain[-1], 1, 0)) is None  # never started
    (failed,) = [f for f in h.facts(chain[-1]) if isinstance(f, SegmentFailed)]
    assert CHILD_DEPTH_EXCEEDED in failed.error


def _deadline(h: LoopHarness, run_id: str) -> int | None:
    state = _state(h, run_id)
    assert state is not None, run_id
    return state.deadline_ms


def test_a_childs_deadline_is_the_tighter_of_its_own_and_its_parents(
    harness: LoopHarness,
) -> None:
    h = harness
    # No parent deadline: the child step's timeout (600 s) from the dispatch bounds it.
    free = h.submit("waiting_parent", {"free": _unique()})
    free_child = child_run_id(free, 1, 0)
    _working(h, lambda: h.suspended(free_child), "the free child waits")
    (suspended,) = [f for f in h.facts(free) if isinstance(f, SegmentSuspended)]
    assert _deadline(h, free_child) == suspended.time_ms + 600_000

    # A parent deadline in 5 s, tighter: the child gets it too.
    command = new_submit("waiting_parent", {"bound": _unique()}, deadline_ms=h.clock() + 5_000)
    h.produce_model(TopicName.COMMANDS, command.run_id, command)
    bound_child = child_run_id(command.run_id, 1, 0)
    _working(h, lambda: h.suspended(bound_child), "the bound child waits")
    assert _deadline(h, bound_child) == _deadline(h, command.run_id) == command.deadline_ms

    # At that deadline the parent times out, and the child with it.
    h.clock.advance_to(h.clock() + 5_000)
    assert _ended(h, command.run_id).status == "timed_out"
    assert _ended(h, bound_child).status in ("timed_out", "cancelled")
    cancel = CancelRun(
        command_id=str(uuid.uuid4()), run_id=free, reason="end", requested_ms=h.clock()
    )
    h.produce_model(TopicName.COMMANDS, free, cancel)
    assert _ended(h, free_child).status == "cancelled"


def test_a_child_step_in_a_graph(harness: LoopHarness) -> None:
    h, n = harness, _unique()
    run_id = h.submit("graph_parent", n)
    parent = _ended(h, run_id)
    assert parent.status == "succeeded", parent.error
    assert payload.loads(parent.result or b"") == {"graph_got": 2 * n}
    (child,) = [c["run_id"] for c in status_dict(parent)["children"]]
    kid = _state(h, str(child))
    assert kid is not None and kid.parent is not None and kid.parent.run_id == run_id
