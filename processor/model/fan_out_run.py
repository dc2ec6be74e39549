"""A fan-out step of a graph run: its function mapped over the items of its input.

The step's input must be a JSON list. ``NodeReady`` (with ``items``) opens the step's
lane; each item then runs in a lane of its own (``lanes.item_segment``), opened by a
``NodeReady`` naming the item, with its own attempts and retries (the step's retry
policy, per item). At most ``max_in_flight`` items are open at once, the lowest
indexes first (``fan_out.FanOutProgress``). ``FanOutItemSettled`` records each item's
output, or its error after its retries; once more items failed than the tolerance
allows, no further item starts and the step fails when the open ones settled.
Otherwise, once every item settled, its output is released once (``StepCompleted``),
in item-index order: ``{"items": [...], "failed": [{"item", "type", "message"}]}``,
with null in ``items`` where an item failed. Pure.
"""

from __future__ import annotations

import functools
import json

from processor.facts import keys
from processor.facts.models import FanOutItemSettled, NodeReady, StepCompleted
from processor.model import attempts
from processor.model.decision import FactMaker
from processor.model.fan_out import FanOutProgress, assemble
from processor.model.graph import FanOutLimits
from processor.model.graph_nodes import graph_of, json_bytes, node_input, settle
from processor.model.lanes import ITEM_SEGMENTS, first_generation, item_segment, segment_of
from processor.model.pipeline_spec import PipelineSpec
from processor.model.state import FORWARD, NodeRun

__all__ = ["FAN_OUT_FAILED", "INVALID_FAN_OUT_INPUT", "item_settled", "start"]

#: The error types of a fan-out step that failed: too many items failed, or its input
#: is no list of items.
FAN_OUT_FAILED = "FanOutFailed"
INVALID_FAN_OUT_INPUT = "InvalidFanOutInput"


def start(maker: FactMaker, spec: PipelineSpec, step: int) -> bool:
    """Open the step's lane and start its first items; whether it settled at once (no
    items, or an input that is no list of them)."""
    given = node_input(spec, maker.run, step)
    items = _items(given)
    maker.add(
        NodeReady(
            **maker.header(keys.node_ready(step)),
            step=step,
            segment=segment_of(step),
            input=given,
            items=0 if items is None else len(items),
        )
    )
    if items is None:
        name = graph_of(spec).nodes[step].name
        error = f"fan-out step {name!r} needs a list of fewer than {ITEM_SEGMENTS} items"
        settle(maker, step, "failed", error=error, error_type=INVALID_FAN_OUT_INPUT)
        return True
    return advance(maker, spec, step)


def item_settled(
    maker: FactMaker,
    spec: PipelineSpec,
    step: int,
    item: int,
    *,
    output: bytes = b"null",
    error: tuple[str, str] | None = None,
) -> bool:
    """Record an item's output (or its ``(type, message)`` error after its retries);
    start the next items, or release the step's output. Whether the step settled."""
    maker.add(
        FanOutItemSettled(
            **maker.header(keys.item_settled(step, item)),
            step=step,
            item=item,
            segment=item_segment(step, item),
            status="succeeded" if error is None else "failed",
            output=output if error is None else b"null",
            error_type=None if error is None else error[0],
            error=None if error is None else error[1],
        )
    )
    return advance(maker, spec, step)


def advance(maker: FactMaker, spec: PipelineSpec, step: int) -> bool:
    """Start the items there is room for, or settle the step; whether it settled.
    Under stop intent no item starts: the open ones settle, then the stop does."""
    node = maker.run.nodes[step]
    progress = _progress(_limits(spec, step), node)
    if progress.settled:
        _release(maker, step, node, progress)
        return True
    if maker.run.stopping:
        return False
    items = _items(maker.run.lane_view(segment_of(step)).last_output) or ()
    for item in progress.to_start():
        segment = item_segment(step, item)
        maker.add(
            NodeReady(
                **maker.header(keys.item_ready(step, item)),
                step=step,
                segment=segment,
                input=items[item],
                item=item,
            )
        )
        attempts.start(
            maker,
            spec,
            FORWARD,
            scope=segment,
            number=1,
            generation=first_generation(len(maker.run.redrives)),
            first_step=step,
            input=items[item],
        )
    return False


def _release(maker: FactMaker, step: int, node: NodeRun, progress: FanOutProgress) -> None:
    """The step's end: failed beyond its tolerance, or its output in item order."""
    errors = node.item_errors.as_dict()
    if progress.failed:
        first = min(errors)
        kind, message = errors[first]
        detail = (
            f"{progress.failures} of {progress.total} items failed, more than tolerated "
            f"(item {first}: {kind}: {message})"
        )
        settle(maker, step, "failed", error=detail, error_type=FAN_OUT_FAILED)
        return
    released = assemble(progress.total, node.item_outputs.as_dict(), errors)
    failed = [
        {"item": item, "type": kind, "message": message}
        for item, (kind, message) in released.errors
    ]
    # Outputs are canonical JSON already: joined, not decoded and encoded again.
    outputs = b",".join(b"null" if out is None else out for out in released.outputs)
    output = b'{"failed":' + json_bytes(failed) + b',"items":[' + outputs + b"]}"
    maker.add(
        StepCompleted(
            **maker.header(keys.step_completed(step)),
            segment=segment_of(step),
            attempt=0,
            generation=0,
            step=step,
            output=output,
        )
    )
    settle(maker, step, "succeeded")


def _limits(spec: PipelineSpec, step: int) -> FanOutLimits:
    limits = graph_of(spec).nodes[step].fan_out
    assert limits is not None, "a fan-out decision for a step without fan-out"
    return limits


def _progress(limits: FanOutLimits, node: NodeRun) -> FanOutProgress:
    return FanOutProgress(
        limits, node.items, node.started_items, node.succeeded_items, node.failed_items
    )


@functools.lru_cache(maxsize=8)
def _items(given: bytes) -> tuple[bytes, ...] | None:
    """The items of a fan-out step's input, each as canonical JSON; None if it is no
    list (or too long). Cached: each item's start reads them, from the same bytes."""
    try:
        value = json.loads(given)
    except ValueError:
        return None
    if not isinstance(value, list) or len(value) >= ITEM_SEGMENTS:
        return None
    return tuple(json_bytes(item) for item in value)
