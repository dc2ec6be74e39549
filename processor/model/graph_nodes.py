"""The steps of a graph run as lanes: opening one (``NodeReady`` and its first
attempt), what a step receives, and closing one (``NodeSettled``).

Each step of a graph runs in a lane of its own, segment ``step + 1``. What a step
receives: the run input if it needs nothing; the output of the one step it needs; or,
with several needs, an object of their outputs by step name (null for a need that was
skipped or failed). A catch handler receives the handled failure: ``{"type",
"message", "attempt", "step"}``. A switch's output is its choice of routes; the routes
receive the switch's own input. A caught step's output, as its successors see it, is
its handler's. Pure.
"""

from __future__ import annotations

import json
from typing import Any

from processor.facts import keys
from processor.facts.models import NodeReady, NodeSettled
from processor.model import attempts
from processor.model.decision import FactMaker
from processor.model.graph import Graph
from processor.model.lanes import first_generation, segment_of
from processor.model.pipeline_spec import PipelineSpec
from processor.model.state import FORWARD, RunState

__all__ = ["graph_of", "json_bytes", "node_input", "run_finally", "settle", "start"]


def graph_of(spec: PipelineSpec) -> Graph:
    assert spec.graph is not None, "a graph decision for a chain"
    return spec.graph


def start(maker: FactMaker, spec: PipelineSpec, step: int) -> None:
    """``NodeReady``: the step's lane opens with its input, and its first attempt starts."""
    segment = segment_of(step)
    given = node_input(spec, maker.run, step)
    maker.add(
        NodeReady(**maker.header(keys.node_ready(step)), step=step, segment=segment, input=given)
    )
    generation = first_generation(len(maker.run.redrives))
    attempts.start(
        maker,
        spec,
        FORWARD,
        scope=segment,
        number=1,
        generation=generation,
        first_step=step,
        input=given,
    )


def run_finally(maker: FactMaker, spec: PipelineSpec) -> bool:
    """Under stop intent, once no step runs: close the lanes the stop fenced
    (``stopped``) and start the finally steps that have not run. Whether any started
    (the unwind then waits for them)."""
    state = maker.run
    for step, node in sorted(state.nodes.items()):
        if node.status == "running":
            settle(maker, step, "stopped")
    graph = graph_of(spec)
    pending = [
        step for step, node in enumerate(graph.nodes) if node.is_finally and step not in state.nodes
    ]
    for step in pending:
        start(maker, spec, step)
    return bool(pending)


def settle(
    maker: FactMaker,
    step: int,
    status: str,
    *,
    error: str | None = None,
    error_type: str | None = None,
) -> None:
    """``NodeSettled``: the step's lane closes (``succeeded``, ``failed`` or ``stopped``),
    and a fan-out step's item lanes with it. A failure's error is the last one recorded
    (its attempt's), unless given."""
    lane = maker.run.lane_view(segment_of(step))
    failure = status == "failed"
    maker.add(
        NodeSettled(
            **maker.header(keys.node_settled(step)),
            step=step,
            segment=segment_of(step),
            status=status,
            error=(error or lane.error) if failure else None,
            error_type=(error_type or lane.error_type) if failure else None,
            attempts=lane.attempt.step_attempts,
        )
    )


def node_input(spec: PipelineSpec, state: RunState, step: int) -> bytes:
    """What the step receives (see the module doc)."""
    graph = graph_of(spec)
    node = graph.nodes[step]
    handled = graph.handles.get(node.name)
    if handled is not None:
        return _failure_input(state, spec.step_index(handled), handled)
    needs = graph.needs(node.name)
    if not needs:
        return state.input
    if len(needs) == 1:
        return _output_seen(spec, state, needs[0])
    outputs = {name: json.loads(_output_seen(spec, state, name)) for name in needs}
    return json_bytes(outputs)


def _output_seen(spec: PipelineSpec, state: RunState, name: str) -> bytes:
    """A step's output as the steps that need it see it."""
    graph = graph_of(spec)
    step = spec.step_index(name)
    node = state.nodes.get(step)
    declared = graph.nodes[step]
    if node is not None and node.status == "caught" and declared.catch is not None:
        return _output_seen(spec, state, declared.catch)
    if declared.routes and node is not None and node.status == "succeeded":
        return node_input(spec, state, step)  # a switch passes its input on
    return state.step_outputs.get(step, b"null")


def _failure_input(state: RunState, step: int, name: str) -> bytes:
    node = state.nodes.get(step)
    error: dict[str, Any] = {
        "type": node.error_type if node is not None else None,
        "message": node.error if node is not None else None,
        "attempt": node.attempts if node is not None else 0,
        "step": name,
    }
    return json_bytes(error)


def json_bytes(value: Any) -> bytes:
    """``value`` as canonical JSON (sorted keys, no spaces)."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()
