"""What ``processor check`` shows of an application: each pipeline version's steps.

Building the ``Application`` runs every check of its definitions (``pipeline.py``);
the outline then says what the processor will run: each step's kind, the segment it
runs in (one attempt runs a segment's steps; an await or a sleep ends one), whether
it is effectful (its attempts are claimed) or compensated, and the pipeline's
trigger topics, output topic and checkpoint.
"""

from __future__ import annotations

from typing import Any

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
        if index == spec.segment_end(first):
            segment, first = segment + 1, index + 1
    return steps


def _kind(step: StepSpec) -> str:
    if step.sleeps is not None:
        return "sleep"
    if step.awaits is not None:
        return step.awaits.kind  # await or checkpoint
    return "step"
