"""A graph run's decisions: which steps run, which are skipped, caught or routed, and
when the run's work ends.

Each step of a graph runs in a lane of its own (segment ``step + 1``): ``NodeReady``
opens the lane with the step's input, its attempts are a chain's (retries, timeouts,
heartbeats, claims, all addressed by the segment), and ``NodeSettled`` closes it. After
any step settles, ``advance`` asks the planner (``graph_plan.plan``, pure) what follows
and records it in the same commit: catch decisions, skips with their reason, the
steps that are now ready, and, once every step settled, the run's outcome
(``GraphSettled``, then success or failure as for a chain).

Opening and closing lanes, and what a step receives, is ``graph_nodes``'s. Under stop
intent nothing new starts but the finally steps (``control.settle_stop``). Pure.
"""

from __future__ import annotations

import json
from typing import cast

from processor.facts import keys
from processor.facts.models import CatchDecided, GraphSettled, NodeSkipped, RouteDecided
from processor.model import control, fan_out_run
from processor.model.decision import FactMaker
from processor.model.finish import finish_success
from processor.model.graph_nodes import graph_of, settle, start
from processor.model.graph_plan import NodeState, SkipReason, plan
from processor.model.lanes import item_of, step_of
from processor.model.pipeline_spec import PipelineSpec
from processor.model.readiness import NodeStatus as PlannedStatus
from processor.model.state import NodeStatus, RunState

__all__ = [
    "INVALID_ROUTE",
    "advance",
    "failed",
    "item_succeeded",
    "predicate_false",
    "route_problem",
    "settle_under_stop",
    "step_of",
    "succeeded",
]

#: The error type of a switch whose function chose no declared route.
INVALID_ROUTE = "InvalidRoute"


#: A step's status as the planner sees it: a step a stop ended counts as failed (no plan
#: is made under stop intent, so only a redrive could meet one).
_PLANNED: dict[NodeStatus, PlannedStatus] = {
    "running": "running",
    "succeeded": "succeeded",
    "failed": "failed",
    "caught": "caught",
    "skipped": "skipped",
    "stopped": "failed",
}


def advance(maker: FactMaker, spec: PipelineSpec) -> None:
    """Record what the planner says now: catches, skips, ready steps, the outcome.

    Under stop intent nothing new starts: the stop settles once no lane runs."""
    state = maker.run
    if state.stopping:
        control.settle_stop(maker, spec)
        return
    graph = graph_of(spec)
    names = [node.name for node in graph.nodes]
    states = {
        names[step]: NodeState(_PLANNED[node.status], cast(SkipReason | None, node.reason))
        for step, node in state.nodes.items()
    }
    routes = {
        names[step]: node.routes for step, node in state.nodes.items() if node.routes is not None
    }
    decided = plan(graph, states, routes)
    for name, handler in decided.caught:
        step = spec.step_index(name)
        maker.add(
            CatchDecided(
                **maker.header(keys.catch_decided(step)),
                step=step,
                handler=spec.step_index(handler),
            )
        )
    for name, reason in decided.skipped:
        step = spec.step_index(name)
        maker.add(NodeSkipped(**maker.header(keys.node_skipped(step)), step=step, reason=reason))
    settled_at_once = False
    for name in decided.ready:
        step = spec.step_index(name)
        if graph.nodes[step].fan_out is not None:
            settled_at_once |= fan_out_run.start(maker, spec, step)
        else:
            start(maker, spec, step)
    if decided.outcome is not None:
        _finish(maker, spec, decided.outcome)
    elif settled_at_once:  # a fan-out step without items: what follows it, now
        advance(maker, spec)


def _finish(maker: FactMaker, spec: PipelineSpec, outcome: str) -> None:
    state = maker.run
    maker.add(
        GraphSettled(
            **maker.header(keys.GRAPH_SETTLED),
            outcome=outcome,
            result_step=_result_step(spec, state),
        )
    )
    if outcome == "succeeded":
        finish_success(maker, spec)
    else:
        control.fail_execution(maker, spec, error=maker.run.error or "a step failed")


def _result_step(spec: PipelineSpec, state: RunState) -> int | None:
    """The step whose output is the run's result: that of the last step declared (not
    a handler nor a finally step) that succeeded, or its handler's if it was caught."""
    graph = graph_of(spec)
    for step in reversed(range(len(graph.nodes))):
        node = graph.nodes[step]
        if node.is_finally or node.name in graph.handles:
            continue
        status = state.nodes.get(step)
        if status is None or status.status not in ("succeeded", "caught"):
            continue
        if status.status == "caught" and node.catch is not None:
            return spec.step_index(node.catch)
        return step
    return None


def succeeded(maker: FactMaker, spec: PipelineSpec, step: int, routes: tuple[str, ...]) -> None:
    """The step's attempt completed it (its ``StepCompleted`` recorded): a switch's
    choice is recorded, the lane closes, and what follows is planned."""
    if routes:
        maker.add(RouteDecided(**maker.header(keys.route_decided(step)), step=step, routes=routes))
    settle(maker, step, "succeeded")
    advance(maker, spec)


def failed(maker: FactMaker, spec: PipelineSpec, step: int) -> None:
    """The step (or the item of a fan-out step that ``maker.lane`` runs) failed for
    good (its ``SegmentFailed`` recorded, no retry left): the lane closes; a catch
    handler, skips or the run's failure follow."""
    item = None if maker.lane is None else item_of(maker.lane)
    if item is not None:
        state = maker.current
        error = (state.error_type or "Error", state.error or "")
        if fan_out_run.item_settled(maker, spec, step, item, error=error):
            advance(maker, spec)
        return
    settle(maker, step, "failed")
    advance(maker, spec)


def predicate_false(maker: FactMaker, spec: PipelineSpec, step: int) -> None:
    """The step's predicate was false: it is skipped (``predicate_false``), its lane
    closes, and what follows is planned (under stop intent, the stop settles)."""
    maker.add(
        NodeSkipped(**maker.header(keys.node_skipped(step)), step=step, reason="predicate_false")
    )
    advance(maker, spec)


def item_succeeded(
    maker: FactMaker, spec: PipelineSpec, step: int, item: int, output: bytes
) -> None:
    """An item of a fan-out step completed: the next items start, or the step settles
    and what follows is planned (under stop intent, the stop settles)."""
    settled = fan_out_run.item_settled(maker, spec, step, item, output=output)
    if maker.run.stopping:
        control.settle_stop(maker, spec)
    elif settled:
        advance(maker, spec)


def settle_under_stop(maker: FactMaker, spec: PipelineSpec, step: int, status: str) -> None:
    """A running step (or item) settles under stop intent: its lane closes, nothing new
    starts."""
    item = None if maker.lane is None else item_of(maker.lane)
    if item is not None:
        state = maker.current
        error = None if status == "succeeded" else (state.error_type or "Error", state.error or "")
        fan_out_run.item_settled(maker, spec, step, item, error=error)
    else:
        settle(maker, step, status)
    control.settle_stop(maker, spec)


def route_problem(spec: PipelineSpec, step: int, output: bytes) -> tuple[tuple[str, ...], str]:
    """A switch's chosen routes from its output, or what is wrong with them."""
    node = graph_of(spec).nodes[step]
    if not node.routes:
        return (), ""
    try:
        chosen = json.loads(output)
    except ValueError:
        chosen = None
    names = [chosen] if isinstance(chosen, str) else chosen
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        return (), f"switch {node.name!r} must return a route name or a list of them"
    unknown = [name for name in names if name not in node.routes]
    if unknown:
        return (), f"switch {node.name!r} chose {unknown}, not among {list(node.routes)}"
    return tuple(dict.fromkeys(names)), ""
