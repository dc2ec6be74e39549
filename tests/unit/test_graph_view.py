"""A run drawn on its pipeline's graph (``processor/model/graph_view.py``): every node
state, routes, catches, skip reasons, and a chain as a line graph."""

from __future__ import annotations

from typing import Any

import pytest

from processor.facts.models import CompensationStepCompleted, StepCompleted
from processor.model.graph_view import NODE_STATES, compensated_steps, graph_view
from processor.model.pipeline_spec import PipelineSpec
from processor.model.state import (
    Compensation,
    ForwardAttempt,
    Lane,
    NodeRun,
    Phase,
    RunState,
    Stop,
)
from processor.worker.pipeline import Pipeline


def _fulfil() -> PipelineSpec:
    """begin -> (charge, reserve [caught by backorder]) -> choose -> ship | pickup ->
    confirm (none_failed), and a finally step."""
    p = Pipeline("fulfil")
    p.step()(_identity("begin"))
    p.step(needs=["begin"])(_identity("charge"))
    p.step(needs=["begin"], catch="backorder")(_identity("reserve"))
    p.step()(_identity("backorder"))
    p.step(needs=["charge", "reserve"], routes=["ship", "pickup"])(_identity("choose"))
    p.step(needs=["choose"])(_identity("ship"))
    p.step(needs=["choose"])(_identity("pickup"))
    p.step(needs=["ship", "pickup"], rule="none_failed")(_identity("confirm"))
    p.finally_step(needs=["confirm"])(_identity("release"))
    return p.spec()


def _chain() -> PipelineSpec:
    p = Pipeline("chain")
    for name in ("a", "b", "c"):
        p.step()(_identity(name))
    return p.spec()


def _identity(name: str) -> Any:
    def step(value: Any) -> Any:
        return value

    step.__name__ = step.__qualname__ = name
    return step


def _run(**changes: Any) -> RunState:
    base = RunState(
        run_id="r-1",
        pipeline="fulfil",
        pipeline_version=1,
        input=b"{}",
        submitted_ms=1,
        created_ms=1,
        updated_ms=1,
        submit_command_id="c-1",
        last_output=b"{}",
    )
    return base.model_copy(update=changes)


def _states(spec: PipelineSpec, state: RunState, **kw: Any) -> dict[str, str]:
    return {node.name: node.state for node in graph_view(spec, state, **kw).nodes}


def _node(spec: PipelineSpec, state: RunState, name: str) -> dict[str, Any]:
    found = [n.as_dict() for n in graph_view(spec, state).nodes if n.name == name]
    assert len(found) == 1
    return found[0]


FULFIL = _fulfil()
STEP = {step.name: i for i, step in enumerate(FULFIL.steps)}


def _nodes(**runs: NodeRun) -> dict[int, NodeRun]:
    return {STEP[name]: run for name, run in runs.items()}


# --- the definition --------------------------------------------------------------------------


def test_the_graph_shows_each_steps_definition_and_column() -> None:
    view = graph_view(FULFIL, _run())
    assert view.shape == "graph"
    by_name = {node.name: node for node in view.nodes}
    assert [n.index for n in view.nodes] == list(range(len(FULFIL.steps)))
    assert by_name["choose"].kind == "switch"
    assert by_name["choose"].routes == ("ship", "pickup")
    assert by_name["reserve"].catch == "backorder"
    assert by_name["backorder"].kind == "handler"
    assert by_name["backorder"].handles == "reserve"
    assert by_name["release"].kind == "finally"
    assert by_name["release"].is_finally
    assert by_name["confirm"].rule == "none_failed"
    assert not any(node.when for node in by_name.values())
    assert by_name["confirm"].needs == ("ship", "pickup")
    depths = {name: node.depth for name, node in by_name.items()}
    assert depths == {
        "begin": 0,
        "charge": 1,
        "reserve": 1,
        "backorder": 2,  # one past the step it handles
        "choose": 2,
        "ship": 3,
        "pickup": 3,
        "confirm": 4,
        "release": 5,  # after every other step
    }
    as_dict = by_name["release"].as_dict()
    assert as_dict["finally"] is True
    assert "is_finally" not in as_dict


def test_edges_are_needs_routes_and_catches() -> None:
    edges = {(e.source, e.target): e for e in graph_view(FULFIL, _run()).edges}
    assert set(edges) == {
        ("begin", "charge"),
        ("begin", "reserve"),
        ("reserve", "backorder"),
        ("charge", "choose"),
        ("reserve", "choose"),
        ("choose", "ship"),
        ("choose", "pickup"),
        ("ship", "confirm"),
        ("pickup", "confirm"),
        ("confirm", "release"),
    }
    assert edges["choose", "ship"].kind == "route"
    assert edges["reserve", "backorder"].kind == "catch"
    assert edges["begin", "charge"].kind == "need"
    assert all(e.taken is None for e in edges.values())  # nothing decided yet
    assert edges["choose", "pickup"].as_dict() == {
        "from": "choose",
        "to": "pickup",
        "kind": "route",
        "taken": None,
    }


# --- a graph run -----------------------------------------------------------------------------


def test_a_step_without_a_node_run_is_pending() -> None:
    assert set(_states(FULFIL, _run()).values()) == {"pending"}


@pytest.mark.parametrize(
    ("phase", "shown"),
    [
        ("dispatched", "running"),
        ("retry_wait", "retry_wait"),
        ("suspended", "waiting"),
        ("definition_blocked", "waiting"),
        ("sleeping", "sleeping"),
        ("unknown", "unknown"),
        ("idle", "running"),
    ],
)
def test_a_running_step_is_shown_by_its_lanes_phase(phase: Phase, shown: str) -> None:
    lane = Lane(phase=phase, attempt=ForwardAttempt(segment=2, number=2, step_attempts=2))
    state = _run(nodes=_nodes(charge=NodeRun(segment=2)), lanes={2: lane})
    node = _node(FULFIL, state, "charge")
    assert (node["state"], node["phase"], node["attempts"], node["segment"]) == (
        shown,
        phase,
        2,
        2,
    )


def test_settled_steps_show_their_outcome_error_and_skip_reason() -> None:
    state = _run(
        nodes=_nodes(
            begin=NodeRun(status="succeeded", segment=1, attempts=1),
            charge=NodeRun(status="succeeded", segment=2, attempts=1),
            reserve=NodeRun(
                status="caught", segment=3, attempts=3, error="no stock", error_type="OutOfStock"
            ),
            backorder=NodeRun(status="succeeded", segment=4, attempts=1),
            choose=NodeRun(status="succeeded", segment=5, attempts=1, routes=("pickup",)),
            ship=NodeRun(status="skipped", reason="predicate_false"),
            pickup=NodeRun(status="failed", segment=6, attempts=1, error="closed", error_type="E"),
            confirm=NodeRun(status="skipped", reason="readiness_unsatisfied"),
            release=NodeRun(status="stopped", segment=7, attempts=1),
        )
    )
    nodes = {n.name: n for n in graph_view(FULFIL, state).nodes}
    assert {name: n.state for name, n in nodes.items()} == {
        "begin": "succeeded",
        "charge": "succeeded",
        "reserve": "caught",
        "backorder": "succeeded",
        "choose": "succeeded",
        "ship": "skipped",
        "pickup": "failed",
        "confirm": "skipped",
        "release": "stopped",
    }
    assert (nodes["reserve"].error, nodes["reserve"].error_type) == ("no stock", "OutOfStock")
    assert nodes["reserve"].attempts == 3
    assert nodes["ship"].reason == "predicate_false"
    assert nodes["confirm"].reason == "readiness_unsatisfied"
    assert nodes["pickup"].error == "closed"
    assert nodes["choose"].routes_taken == ("pickup",)
    assert nodes["choose"].as_dict()["routes_taken"] == ["pickup"]


def test_the_route_taken_and_the_catch_mark_their_edges() -> None:
    state = _run(
        nodes=_nodes(
            reserve=NodeRun(status="caught", segment=3),
            choose=NodeRun(status="succeeded", segment=5, routes=("pickup",)),
        )
    )
    edges = {(e.source, e.target): e.taken for e in graph_view(FULFIL, state).edges}
    assert edges["choose", "pickup"] is True
    assert edges["choose", "ship"] is False
    assert edges["reserve", "backorder"] is True
    assert edges["begin", "charge"] is None  # a need is never "taken"


def test_a_catch_not_taken_once_the_step_succeeded() -> None:
    state = _run(nodes=_nodes(reserve=NodeRun(status="succeeded", segment=3)))
    edges = {(e.source, e.target): e.taken for e in graph_view(FULFIL, state).edges}
    assert edges["reserve", "backorder"] is False
    for undecided in (NodeRun(segment=3), NodeRun(status="failed", segment=3)):
        running = _run(nodes=_nodes(reserve=undecided))
        edges = {(e.source, e.target): e.taken for e in graph_view(FULFIL, running).edges}
        assert edges["reserve", "backorder"] is None  # failed: the catch fact comes next


def test_the_unwind_shows_compensating_then_compensated() -> None:
    nodes = _nodes(
        begin=NodeRun(status="succeeded", segment=1),
        charge=NodeRun(status="succeeded", segment=2),
        reserve=NodeRun(status="failed", segment=3),
    )
    unwinding = _run(
        nodes=nodes,
        phase="compensating",
        stop=Stop(reason="failed"),
        compensation=Compensation(started=True, unwind=(0,), step=STEP["charge"]),
    )
    states = _states(FULFIL, unwinding, compensated=frozenset())
    assert (states["charge"], states["begin"], states["reserve"]) == (
        "compensating",
        "succeeded",
        "failed",
    )
    done = _run(nodes=nodes, status="failed", compensation=Compensation(started=True))
    states = _states(FULFIL, done, compensated=frozenset({STEP["charge"], STEP["begin"]}))
    assert (states["charge"], states["begin"]) == ("compensated", "compensated")


def test_compensated_steps_are_read_from_the_facts() -> None:
    head = {"run_id": "r-1", "fact_key": "k", "time_ms": 1, "cause_id": "c"}
    facts = [
        StepCompleted(seq=1, segment=1, attempt=1, generation=0, step=0, output=b"1", **head),
        CompensationStepCompleted(seq=2, step=2, attempt=1, generation=0, **head),
        CompensationStepCompleted(seq=3, step=0, attempt=1, generation=0, **head),
    ]
    assert compensated_steps(facts) == frozenset({0, 2})


def test_every_state_is_listed() -> None:
    assert set(NODE_STATES) == {
        "pending",
        "running",
        "retry_wait",
        "waiting",
        "sleeping",
        "unknown",
        "succeeded",
        "failed",
        "caught",
        "skipped",
        "stopped",
        "compensating",
        "compensated",
        "not_run",
    }


# --- a chain ---------------------------------------------------------------------------------


def test_a_chain_is_a_line_graph() -> None:
    view = graph_view(_chain(), _run(pipeline="chain"))
    assert view.shape == "chain"
    assert [(n.name, n.needs, n.depth, n.kind) for n in view.nodes] == [
        ("a", (), 0, "step"),
        ("b", ("a",), 1, "step"),
        ("c", ("b",), 2, "step"),
    ]
    assert [(e.source, e.target, e.kind) for e in view.edges] == [
        ("a", "b", "need"),
        ("b", "c", "need"),
    ]
    assert [n.state for n in view.nodes] == ["pending"] * 3  # nothing dispatched yet


def test_a_chains_states_come_from_its_completed_steps_and_attempt() -> None:
    attempt = ForwardAttempt(segment=1, number=2, next_step=1, step_attempts=2)
    running = _run(completed_steps=(0,), attempt=attempt, phase="retry_wait")
    view = graph_view(_chain(), running)
    assert [n.state for n in view.nodes] == ["succeeded", "retry_wait", "pending"]
    assert (view.nodes[1].attempts, view.nodes[1].phase) == (2, "retry_wait")

    waiting = running.model_copy(update={"phase": "suspended"})
    assert _states(_chain(), waiting) == {"a": "succeeded", "b": "waiting", "c": "pending"}


def test_a_chains_failed_step_shows_its_error_and_a_cancel_stops_the_current_step() -> None:
    attempt = ForwardAttempt(segment=1, number=3, next_step=1, step_attempts=3)
    failed = _run(
        status="failed",
        completed_steps=(0,),
        attempt=attempt,
        failed_step=1,
        error="boom",
        error_type="ValueError",
    )
    b = _node(_chain(), failed, "b")
    assert (b["state"], b["error"], b["error_type"], b["attempts"]) == (
        "failed",
        "boom",
        "ValueError",
        3,
    )
    assert _states(_chain(), failed)["c"] == "not_run"  # the run ended before it
    cancelled = _run(status="cancelled", completed_steps=(0,), attempt=attempt)
    assert _states(_chain(), cancelled) == {"a": "succeeded", "b": "stopped", "c": "not_run"}


def test_a_chains_unwind_is_shown_too() -> None:
    attempt = ForwardAttempt(segment=1, number=1, next_step=2)
    unwinding = _run(
        completed_steps=(0, 1),
        attempt=attempt,
        failed_step=2,
        phase="compensating",
        compensation=Compensation(started=True, unwind=(0,), step=1),
    )
    states = _states(_chain(), unwinding, compensated=frozenset())
    assert states == {"a": "succeeded", "b": "compensating", "c": "failed"}
    states = _states(_chain(), unwinding, compensated=frozenset({1}))
    assert states["b"] == "compensated"


# --- fan-out ---------------------------------------------------------------------------------


def _priced() -> PipelineSpec:
    p = Pipeline("priced")
    p.step()(_identity("lines"))
    p.fan_out(needs=["lines"], max_in_flight=2, tolerate_percent=10)(_identity("price"))
    return p.spec()


def test_a_fan_out_shows_its_limits_and_its_items_progress() -> None:
    spec = _priced()
    pending = graph_view(spec, _run(pipeline="priced")).nodes[1]
    assert (pending.kind, pending.state, pending.progress) == ("fan_out", "pending", None)
    assert pending.fan_out == {
        "max_in_flight": 2,
        "tolerance_count": None,
        "tolerance_percent": 10,
    }
    items = {"items": 5, "started_items": 3, "succeeded_items": 1, "failed_items": 1}
    running = _run(
        pipeline="priced",
        nodes={0: NodeRun(status="succeeded", segment=1), 1: NodeRun(segment=2, **items)},
    )
    price = graph_view(spec, running).nodes[1]
    assert price.state == "running"
    assert price.progress == {"done": 1, "in_flight": 1, "failed": 1, "total": 5}
    settled = {**items, "started_items": 5, "succeeded_items": 4}
    done = _run(
        pipeline="priced",
        nodes={1: NodeRun(status="succeeded", segment=2, **settled)},
    )
    progress = graph_view(spec, done).nodes[1].progress
    assert progress == {"done": 4, "in_flight": 0, "failed": 1, "total": 5}
    assert graph_view(spec, done).nodes[0].progress is None  # not a fan-out


def test_a_graph_step_still_pending_when_the_run_ended_did_not_run() -> None:
    nodes = _nodes(begin=NodeRun(status="succeeded", segment=1), charge=NodeRun(segment=2))
    running = _states(FULFIL, _run(nodes=nodes))
    assert (running["charge"], running["choose"]) == ("running", "pending")
    stopped = {**nodes, STEP["charge"]: NodeRun(status="stopped", segment=2)}
    cancelled = _states(FULFIL, _run(nodes=stopped, status="cancelled"))
    assert (cancelled["charge"], cancelled["choose"], cancelled["release"]) == (
        "stopped",
        "not_run",
        "not_run",
    )


def test_a_guarded_step_says_so_and_shows_its_predicates_skip() -> None:
    p = Pipeline("guarded")
    p.step()(_identity("order"))
    p.step(needs=["order"], when=lambda order: bool(order.get("gift")))(_identity("wrap"))
    spec = p.spec()
    wrap = graph_view(spec, _run(pipeline="guarded")).nodes[1]
    assert (wrap.when, wrap.as_dict()["when"]) == (True, True)
    assert graph_view(spec, _run(pipeline="guarded")).nodes[0].when is False
    skipped = _run(
        pipeline="guarded",
        nodes={
            0: NodeRun(status="succeeded", segment=1),
            1: NodeRun(status="skipped", reason="predicate_false"),
        },
    )
    node = graph_view(spec, skipped).nodes[1]
    assert (node.state, node.reason) == ("skipped", "predicate_false")
