"""What ``processor check`` shows of an application: each pipeline version's steps.

Building the ``Application`` runs every check of its definitions (``pipeline.py``);
the outline then says what the processor will run: each step's kind, the segment it
runs in (one attempt runs a segment's steps; an await or a sleep ends one; in a graph
every step is a segment, and its needs, rule, routes and handler are shown), whether
it is effectful (its attempts are claimed) or compensated, and the pipeline's
trigger topics, output topic and checkpoint.
"""

from __future__ import annotations

from typing import Any

from processor.model.graph import Node
from processor.model.pipeline_spec import PipelineSpec, StepSpec
from processor.worker.pipeline import Application

__all__ = ["outline", "outline_text"]


def outline(app: Application) -> list[dict[str, Any]]:
    """Each pipeline version of ``app``, oldest first, as a JSON value."""
    shown = []
    for name, version in app.versions:
        spec = app.get(name, version)
        pipeline = app.pipeline(name, version)
        assert spec is not None and pipeline is not None  # both come from app.versions
        shown.append(
            {
                "pipeline": name,
                "version": version,
                "steps": _steps(spec),
                "triggers": [trigger.topic for trigger in pipeline.triggers],
                "output_topic": spec.output_topic,
                "checkpoint": None if spec.checkpoint is None else spec.checkpoint.name,
                "deadline_s": None if spec.deadline_ms is None else spec.deadline_ms / 1000,
            }
        )
    return shown


def outline_text(shown: list[dict[str, Any]]) -> str:
    """``outline`` as lines for a terminal."""
    lines = []
    for pipeline in shown:
        segments = max(step["segment"] for step in pipeline["steps"])
        lines.append(
            f"{pipeline['pipeline']} v{pipeline['version']}: {len(pipeline['steps'])} steps "
            f"in {segments} segments"
        )
        for step in pipeline["steps"]:
            marks = [m for m in ("effectful", "compensated") if step[m]]
            marks += _graph_marks(step.get("graph"))
            lines.append(
                f"  {step['index']:>3} {step['name']:<24} {step['kind']:<10} "
                f"segment {step['segment']}{''.join(f', {m}' for m in marks)}"
            )
    return "\n".join(lines)


def _steps(spec: PipelineSpec) -> list[dict[str, Any]]:
    steps, segment, first = [], 1, 0
    for index, step in enumerate(spec.steps):
        steps.append(
            {
                "index": index,
                "name": step.name,
                "kind": _kind(step),
                "segment": segment,
                "effectful": step.effectful,
                "compensated": step.compensation is not None,
                "timeout_s": step.timeout_ms / 1000,
            }
        )
        if spec.graph is not None:
            steps[-1]["graph"] = _node(spec.graph.nodes[index])
        if index == spec.segment_end(first):
            segment, first = segment + 1, index + 1
    return steps


def _node(node: Node) -> dict[str, Any]:
    """A graph step's place in its graph: what it needs, its rule, routes and handler."""
    return {
        "needs": list(node.needs or ()),
        "rule": node.rule,
        "routes": list(node.routes),
        "catch": node.catch,
        "finally": node.is_finally,
        "max_in_flight": None if node.fan_out is None else node.fan_out.max_in_flight,
    }


def _graph_marks(node: dict[str, Any] | None) -> list[str]:
    if node is None:
        return []
    marks = [f"needs {', '.join(node['needs']) or 'nothing'}"]
    if node["rule"] != "all_success":
        marks.append(f"rule {node['rule']}")
    if node["routes"]:
        marks.append(f"routes to {', '.join(node['routes'])}")
    if node["catch"]:
        marks.append(f"caught by {node['catch']}")
    if node["finally"]:
        marks.append("finally")
    if node["max_in_flight"] is not None:
        marks.append(f"fan-out, {node['max_in_flight']} in flight")
    return marks


def _kind(step: StepSpec) -> str:
    if step.sleeps is not None:
        return "sleep"
    if step.awaits is not None:
        return step.awaits.kind  # await or checkpoint
    return "step"
