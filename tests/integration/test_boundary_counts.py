"""A boundary's counts (``Boundary.total``, ``settled``, ``failed``) are kept by the
fold as its interactions come and settle, so that an admission to a boundary of many
items decides without reading them all. At every fact of these runs they equal a
reading of the interactions (in a chain, with queued items and failures, and in a
graph run's lanes), and a row stored before they were kept is planned the same way."""

from __future__ import annotations

from typing import Any

from processor import LocalEnvironment
from processor.facts.models import BoundaryDispatchCompleted
from processor.model.continuation import plan_continuation
from processor.model.graph import Tolerance
from processor.model.reduce import reduce
from processor.model.state import Boundary, RunState
from processor.worker.pipeline import Application, Pipeline
from tests.apps.label_pipelines import answer_all, batched

branches = Pipeline("counted_branches")


@branches.step()
def request(order: dict[str, Any]) -> dict[str, Any]:
    return order


@branches.await_step(needs=["request"], target="payments", timeout_s=600, itemized=True)
def pay(order: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"amount": order["total"]}, {"amount": 1}]


@branches.await_step(needs=["request"], target="warehouse", timeout_s=60, on_timeout="continue")
def pack(order: dict[str, Any]) -> dict[str, Any]:
    return {"items": order["items"]}


@branches.step(needs=["pay", "pack"])
def done(outputs: dict[str, Any]) -> dict[str, Any]:
    return outputs


def _states(env: LocalEnvironment, run_id: str) -> list[RunState]:
    """The run after each fact of its history."""
    states, state = [], None
    for fact in env.history(run_id):
        state = reduce(state, fact)
        assert state is not None
        states.append(state)
    return states


def _boundaries(state: RunState) -> list[Boundary]:
    return [state.boundary, *(lane.boundary for lane in state.lanes.values())]


def _uncounted(state: RunState) -> RunState:
    """``state`` as a row stored before the counts were kept reads back."""
    blank = state.boundary.evolve({"total": 0, "settled": 0, "failed": 0})
    return state.evolve({"boundary": blank})


def test_a_chains_counts_equal_a_reading_at_every_fact_with_queued_items_and_failures() -> None:
    with LocalEnvironment(Application([batched])) as env:
        tolerated = env.submit("batched", {"parcels": 6})
        answer_all(env, tolerated, failing={4})
        failed = env.submit("batched", {"parcels": 6})
        answer_all(env, failed, failing={1, 3})
        assert env.wait(tolerated).status == "succeeded"
        assert env.wait(failed).status == "failed"
        runs = {run_id: _states(env, run_id) for run_id in (tolerated, failed)}
    tolerance = Tolerance(count=1)
    for run_id, states in runs.items():
        for state in states:
            assert state.boundary == state.boundary.counted(state.interactions.values())
            planned = plan_continuation(state, tolerance)
            assert plan_continuation(_uncounted(state), tolerance) == planned, run_id
    ended = {run_id: states[-1].boundary for run_id, states in runs.items()}
    assert (ended[tolerated].total, ended[tolerated].settled, ended[tolerated].failed) == (6, 6, 1)
    assert (ended[failed].total, ended[failed].settled, ended[failed].failed) == (6, 4, 2)


def test_the_counts_of_a_graph_runs_lanes_equal_a_reading_at_every_fact() -> None:
    with LocalEnvironment(Application([branches])) as env:
        run_id = env.submit("counted_branches", {"total": 7, "items": 3})
        env.wait_fact(run_id, BoundaryDispatchCompleted, count=2)  # each in its own lane
        for pending in env.pending(run_id):
            if pending.target == "payments":
                env.complete(pending, {"paid": pending.item_index})
        env.advance(61)  # the warehouse's timeout passes (continue)
        result = env.wait(run_id)
        states = _states(env, run_id)
    assert result.status == "succeeded", result
    counted_lanes = 0
    for state in states:
        for boundary in _boundaries(state):
            assert boundary == boundary.counted(state.interactions.values())
            counted_lanes += boundary.total > 0 and bool(state.lanes)
    assert counted_lanes > 0  # the lanes' boundaries were counted while they waited
    settled = [
        (lane.boundary.total, lane.boundary.settled)
        for state in states
        for lane in state.lanes.values()
        if lane.boundary.total
    ]
    assert (2, 2) in settled  # pay's two items, both admitted, before its lane released
