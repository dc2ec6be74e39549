"""A run drawn on its pipeline's graph: what the inspector's graph and
``GET /api/runs/{id}/graph`` show.

``graph_view(spec, state, compensated)`` answers, for one run as of one fact, each
step's place in the graph (its needs, rule, predicate, routes, catch handler, finally,
fan-out, and its ``depth``: the column a layered drawing puts it in) and where it
stands:

- ``pending``: not run yet (a graph step without a ``NodeRun``);
- ``running``, ``retry_wait``, ``waiting``, ``sleeping``, ``unknown``: in flight, as
  its lane's phase says (``phase`` keeps the phase itself);
- ``succeeded``, ``failed`` (with its error), ``caught`` (its handler took over),
  ``skipped`` (with its ``reason``), ``stopped`` (a cancel or deadline ended it);
- ``compensating`` and ``compensated``: the run's unwind undoes it, or has;
- ``not_run``: the run ended (a failure, a cancel, the deadline) before it ran, and
  nothing skipped it.

A fan-out step that ran has its ``progress``: items done (succeeded), in flight and
failed, of the total.

A chain is a line graph (each step needs the one before); its steps' states come from
``completed_steps``, the attempt's ``next_step`` and the run's phase, ``failed_step``
and the unwind. The edges are the needs (``route`` when the need is a switch that may
choose the step, with ``taken`` once it chose) and each catch (handled step to its
handler, ``taken`` once caught).

``compensated_steps(facts)`` lists the steps the unwind compensated
(``CompensationStepCompleted``): the projection counts them, the facts name them. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

from processor.facts.models import CompensationStepCompleted, FactHeader
from processor.model.graph import Graph, Node
from processor.model.pipeline_spec import PipelineSpec, StepSpec
from processor.model.state import NodeRun, Phase, RunState

__all__ = [
    "NODE_STATES",
    "EdgeView",
    "GraphView",
    "NodeView",
    "compensated_steps",
    "graph_view",
]

NodeState = Literal[
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
]
#: Every state a node is shown in, for the page's legend and the tests.
NODE_STATES: tuple[str, ...] = get_args(NodeState)

#: A step in flight, shown by what its lane (or a chain run) waits for. A graph's lane
#: in another phase is shown running (idle: ready, its attempt not started yet); a
#: chain's next step in another phase is pending (idle: nothing dispatched yet; the
#: unwind's phases: the forward work is over).
_IN_FLIGHT: dict[Phase, NodeState] = {
    "dispatched": "running",
    "retry_wait": "retry_wait",
    "suspended": "waiting",
    "definition_blocked": "waiting",
    "sleeping": "sleeping",
    "unknown": "unknown",
}
_STOPS = frozenset({"cancelled", "timed_out"})
#: The statuses of a step with a catch handler that settle whether the handler runs.
_CATCH_SETTLED = frozenset({"caught", "succeeded", "skipped", "stopped"})


@dataclass(frozen=True, slots=True)
class NodeView:
    """One step as drawn: its definition, its column, and where it stands."""

    index: int
    name: str
    kind: str  # step, await, sleep, switch, handler, finally, fan_out
    needs: tuple[str, ...]
    rule: str
    when: bool  # guarded by a predicate on its input (skipped predicate_false when false)
    routes: tuple[str, ...]
    catch: str | None
    is_finally: bool
    handles: str | None  # the step a catch handler handles
    fan_out: dict[str, Any] | None
    depth: int
    state: NodeState = "pending"
    phase: str | None = None  # its lane's phase while in flight
    reason: str | None = None  # why it was skipped
    routes_taken: tuple[str, ...] | None = None
    attempts: int | None = None
    error: str | None = None
    error_type: str | None = None
    segment: int | None = None
    progress: dict[str, int] | None = None  # a fan-out's items: done, in flight, failed, total

    def as_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__slots__}
        out["finally"] = out.pop("is_finally")
        for name in ("needs", "routes", "routes_taken"):
            out[name] = None if out[name] is None else list(out[name])
        return out


@dataclass(frozen=True, slots=True)
class EdgeView:
    """``source`` -> ``target``: a need, a route of a switch, or a catch."""

    source: str
    target: str
    kind: Literal["need", "route", "catch"]
    taken: bool | None = None  # a route or catch: chosen (True), not (False), undecided

    def as_dict(self) -> dict[str, Any]:
        return {"from": self.source, "to": self.target, "kind": self.kind, "taken": self.taken}


@dataclass(frozen=True, slots=True)
class GraphView:
    """A run on its pipeline's graph."""

    shape: Literal["graph", "chain"]
    nodes: tuple[NodeView, ...]
    edges: tuple[EdgeView, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "shape": self.shape,
            "nodes": [node.as_dict() for node in self.nodes],
            "edges": [edge.as_dict() for edge in self.edges],
        }


def compensated_steps(facts: Iterable[FactHeader]) -> frozenset[int]:
    """The steps whose compensator completed, from a run's facts."""
    return frozenset(f.step for f in facts if isinstance(f, CompensationStepCompleted))


def graph_view(
    spec: PipelineSpec, state: RunState, compensated: frozenset[int] = frozenset()
) -> GraphView:
    """The run ``state`` drawn on ``spec``'s graph (a chain's line graph if it has none)."""
    graph = spec.graph if spec.graph is not None else _line(spec)
    shape: Literal["graph", "chain"] = "chain" if spec.graph is None else "graph"
    depths = _depths(graph)
    nodes = []
    placed = _graph_state if shape == "graph" else _chain_state
    for index, (step, node) in enumerate(zip(spec.steps, graph.nodes, strict=True)):
        drawn = placed(_definition(index, step, node, graph, depths[node.name]), state)
        nodes.append(_ended(_unwound(drawn, state, compensated), state))
    return GraphView(shape, tuple(nodes), tuple(_edges(graph, state, shape)))


# --- the definition ----------------------------------------------------------------------


def _line(spec: PipelineSpec) -> Graph:
    """A chain as a graph: each step needs the one before."""
    names = [step.name for step in spec.steps]
    nodes = tuple(Node(name, needs=tuple(names[i - 1 : i])) for i, name in enumerate(names))
    return Graph(nodes, {n.name: n for n in nodes}, {}, {})


def _depths(graph: Graph) -> dict[str, int]:
    """Each step's column: one past its deepest need; a handler one past the step it
    handles; finally steps after every other step."""
    depths: dict[str, int] = {}

    def depth(name: str) -> int:
        if name not in depths:
            handled = graph.handles.get(name)
            needs = (handled,) if handled is not None else graph.needs(name)
            depths[name] = 1 + max((depth(need) for need in needs), default=-1)
        return depths[name]

    for node in graph.nodes:
        if not node.is_finally:
            depth(node.name)
    last = max(depths.values(), default=-1)
    for node in graph.nodes:
        if node.is_finally:
            depths[node.name] = max(last + 1, depth(node.name))
    return depths


def _kind(step: StepSpec, node: Node, graph: Graph) -> str:
    if node.is_finally:
        return "finally"
    if node.name in graph.handles:
        return "handler"
    if node.routes:
        return "switch"
    if node.fan_out is not None:
        return "fan_out"
    if step.awaits is not None:
        return "await"
    return "sleep" if step.sleeps is not None else "step"


def _definition(index: int, step: StepSpec, node: Node, graph: Graph, depth: int) -> NodeView:
    fan_out = None
    if node.fan_out is not None:
        tolerance = node.fan_out.tolerance
        fan_out = {
            "max_in_flight": node.fan_out.max_in_flight,
            "tolerance_count": tolerance.count,
            "tolerance_percent": tolerance.percent,
        }
    return NodeView(
        index=index,
        name=node.name,
        kind=_kind(step, node, graph),
        needs=graph.needs(node.name),
        rule=node.rule,
        when=node.when,
        routes=node.routes,
        catch=node.catch,
        is_finally=node.is_finally,
        handles=graph.handles.get(node.name),
        fan_out=fan_out,
        depth=depth,
    )


def _edges(graph: Graph, state: RunState, shape: str) -> Iterable[EdgeView]:
    index = {node.name: i for i, node in enumerate(graph.nodes)}
    runs: Mapping[int, NodeRun] = state.nodes if shape == "graph" else {}
    for node in graph.nodes:
        for need in graph.needs(node.name):
            switch = graph.by_name[need]
            if node.name not in switch.routes:
                yield EdgeView(need, node.name, "need")
                continue
            chosen = runs.get(index[need], NodeRun()).routes
            yield EdgeView(
                need, node.name, "route", None if chosen is None else node.name in chosen
            )
        if node.catch is not None:
            yield EdgeView(node.name, node.catch, "catch", _caught(runs.get(index[node.name])))


def _caught(handled: NodeRun | None) -> bool | None:
    """Whether a step's catch took over: yes, no (it succeeded, was skipped or stopped),
    or not known yet (pending, running, or failed before the decision's fact)."""
    if handled is None or handled.status not in _CATCH_SETTLED:
        return None
    return handled.status == "caught"


# --- where each step stands ----------------------------------------------------------------


def _graph_state(drawn: NodeView, state: RunState) -> NodeView:
    run = state.nodes.get(drawn.index)
    if run is None:
        return drawn
    settled = {
        "reason": run.reason,
        "routes_taken": run.routes,
        "attempts": run.attempts or None,
        "error": run.error,
        "error_type": run.error_type,
        "segment": run.segment or None,
        "progress": None if drawn.fan_out is None else _progress(run),
    }
    if run.status != "running":
        return _with(drawn, state=run.status, **settled)
    lane = state.lanes.get(run.segment)
    phase: Phase = "idle" if lane is None else lane.phase
    attempts = None if lane is None else lane.attempt.step_attempts or None
    return _with(
        drawn,
        **settled | {"attempts": attempts},
        state=_IN_FLIGHT.get(phase, "running"),
        phase=phase,
    )


def _chain_state(drawn: NodeView, state: RunState) -> NodeView:
    index = drawn.index
    if index in state.completed_steps:
        return _with(drawn, state="succeeded")
    if index == state.failed_step:
        return _with(
            drawn,
            state="failed",
            error=state.error,
            error_type=state.error_type,
            attempts=state.attempt.step_attempts or None,
            segment=state.attempt.segment,
        )
    if index != state.attempt.next_step:
        return drawn
    if state.terminal:
        stopped = state.status in _STOPS and state.attempt.number > 0
        return _with(drawn, state="stopped") if stopped else drawn
    shown = _IN_FLIGHT.get(state.phase)
    if shown is None:
        return drawn
    return _with(
        drawn,
        state=shown,
        phase=state.phase,
        attempts=state.attempt.step_attempts or None,
        segment=state.attempt.segment,
    )


def _unwound(drawn: NodeView, state: RunState, compensated: frozenset[int]) -> NodeView:
    if drawn.index in compensated:
        return _with(drawn, state="compensated")
    unwind = state.compensation
    if unwind.started and unwind.step == drawn.index and not state.terminal:
        return _with(drawn, state="compensating", phase=state.phase)
    return drawn


def _ended(drawn: NodeView, state: RunState) -> NodeView:
    """A step still pending when the run ended never runs."""
    return _with(drawn, state="not_run") if drawn.state == "pending" and state.terminal else drawn


def _progress(run: NodeRun) -> dict[str, int]:
    """A fan-out's items: done (succeeded), in flight, failed, of the total."""
    settled = run.succeeded_items + run.failed_items
    return {
        "done": run.succeeded_items,
        "in_flight": run.started_items - settled,
        "failed": run.failed_items,
        "total": run.items,
    }


def _with(drawn: NodeView, **changes: Any) -> NodeView:
    return replace(drawn, **changes)
