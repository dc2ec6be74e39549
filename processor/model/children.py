"""Child runs: a step starts runs of another pipeline and waits for their outcomes (pure).

A child step (``Pipeline.child``) is an await whose interactions are runs: each item
the step's function returns is the input of one child run of the target pipeline.
Dispatching an interaction produces a ``SubmitRun`` on runs.commands in the
transaction that records the dispatch, so a redo after a crash submits the same
command again:

- The child's id is derived from the parent run, its redrives, the step and the
  item (``child_run_id``), and the command id from the child's id: a retry, a redo
  or a redelivery names the same child, which the submit stage starts once.
- The child records ``ChildRunLinked`` (the parent, the token of the parent's
  interaction, its depth) after its ``RunSubmitted``; when it ends, however it ends,
  its outcome goes to the parent as a ``BoundaryCompletion`` with that token
  (``parent_link.parent_completion``) and passes the same admission stage as an
  await completion: the continuation planner releases the step, records an item,
  applies the step's tolerance, or fails the step.
- Its deadline is the tightest of its pipeline's, the child step's timeout and the
  parent's deadline.
- Nesting is bounded: a child deeper than ``MAX_CHILD_DEPTH`` is not started; the
  parent's interaction fails with ``child_depth_exceeded`` (through admission too),
  and a submit above the bound is refused with that reason.
- A parent that stops (cancel, deadline, failure) sends a ``CancelRun`` to each child
  still open; the child stops as a cancelled run does. The parent does not end before
  them: its stop waits while a child is open (``waits.children_open``), their
  outcomes are admitted and recorded, and its unwind begins once the last one is in
  or timed out. An outcome arriving at a parent that has ended is refused with a
  reason (``admission.rejected``).
"""

from __future__ import annotations

import hashlib

from processor.facts.models import BoundaryCompletion, CancelRun, ChildRunLinked, SubmitRun
from processor.facts.topics import TopicName
from processor.model.decision import Context, Emit, FactMaker
from processor.model.pipeline_spec import AwaitSpec
from processor.model.state import RunState

__all__ = [
    "CHILD_DEPTH_EXCEEDED",
    "MAX_CHILD_DEPTH",
    "cancel_children",
    "child_run_id",
    "children_of",
    "link",
    "parent_of",
    "start_child",
    "submit_refusal",
]

#: How deep children may nest: a run nobody started is at depth 0.
MAX_CHILD_DEPTH = 8
#: The reason a child above ``MAX_CHILD_DEPTH`` is refused.
CHILD_DEPTH_EXCEEDED = "child_depth_exceeded"
#: The reason a child of a pipeline nobody defined is not started.
UNKNOWN_CHILD_PIPELINE = "unknown_pipeline"


def child_run_id(parent_run_id: str, boundary: int, item: int) -> str:
    """The id of the child started for ``item`` of the child step that suspended at
    ``boundary`` (its segment: the same for every attempt of the step, and new after a
    redrive) of a run: the same for every retry, redo and redelivery; UUID-shaped."""
    text = f"child|{len(parent_run_id)}:{parent_run_id}|{boundary}|{item}"
    h = hashlib.sha256(text.encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def start_child(
    maker: FactMaker,
    awaits: AwaitSpec,
    ctx: Context,
    *,
    boundary: int,
    index: int,
    request: bytes,
    token: str,
    deadline_ms: int,
) -> None:
    """Submit the child run of interaction ``index`` (its input ``request``), or fail the
    interaction through admission if it may not start."""
    run = maker.run
    child = child_run_id(run.run_id, boundary, index)
    depth = (run.parent.depth if run.parent is not None else 0) + 1
    spec = ctx.catalog.latest(awaits.target)
    if depth > MAX_CHILD_DEPTH:
        detail = f"a child of run {run.run_id} would be at depth {depth}, over {MAX_CHILD_DEPTH}"
        _fail_interaction(maker, token, child, f"{CHILD_DEPTH_EXCEEDED}: {detail}")
        return
    if spec is None:
        detail = f"no pipeline named {awaits.target!r} to start a child of"
        _fail_interaction(maker, token, child, f"{UNKNOWN_CHILD_PIPELINE}: {detail}")
        return
    bounds = [deadline_ms, run.deadline_ms]
    if spec.deadline_ms is not None:
        bounds.append(maker.now + spec.deadline_ms)
    submit = SubmitRun(
        command_id=f"child/{child}",
        run_id=child,
        pipeline=awaits.target,
        input=request or b"null",
        submitted_ms=maker.now,
        deadline_ms=min(b for b in bounds if b is not None),
        traceparent=run.traceparent,
        parent_run_id=run.run_id,
        parent_token=token,
        depth=depth,
    )
    maker.emits.append(Emit(TopicName.COMMANDS, child, submit))


def _fail_interaction(maker: FactMaker, token: str, child: str, error: str) -> None:
    """A failed outcome of the interaction, sent to the run itself: admitted like a child's."""
    completion = BoundaryCompletion(
        token=token,
        idempotency_key=f"child/{child}",
        outcome="failure",
        payload=b"null",
        error=error,
        content_type="application/json",
    )
    maker.emits.append(Emit(TopicName.COMPLETIONS, maker.run_id, completion))


def submit_refusal(command: SubmitRun) -> tuple[str, str] | None:
    """Why a submit of a child may not start it (reason, detail), or None."""
    if command.depth > MAX_CHILD_DEPTH:
        detail = f"depth {command.depth} is over the limit of {MAX_CHILD_DEPTH}"
        return CHILD_DEPTH_EXCEEDED, detail
    if (command.parent_run_id is None) != (command.parent_token is None):
        return "invalid_command", "a child names both its parent run and the parent's token"
    return None


def link(maker: FactMaker, command: SubmitRun) -> None:
    """Record a child run's parent (after its ``RunSubmitted``)."""
    if command.parent_run_id is None or command.parent_token is None:
        return
    maker.add(
        ChildRunLinked(
            **maker.header("child/linked"),
            parent_run_id=command.parent_run_id,
            parent_token=command.parent_token,
            depth=command.depth,
        )
    )


def children_of(state: RunState) -> list[dict[str, object]]:
    """The children a run started (status, API): id, item, and their interaction's state."""
    started = [
        (interaction.boundary, interaction.item_index, interaction.status)
        for interaction in state.interactions.values()
        if interaction.kind == "child" and interaction.status != "queued"
    ]
    return [
        {
            "run_id": child_run_id(state.run_id, boundary, item),
            "boundary": boundary,
            "item": item,
            "interaction": status,
        }
        for boundary, item, status in sorted(started)
    ]


def parent_of(state: RunState) -> dict[str, object] | None:
    """Whose child the run is (status, API): the parent run and the depth."""
    if state.parent is None:
        return None
    return {"run_id": state.parent.run_id, "depth": state.parent.depth}


def cancel_children(maker: FactMaker, before: RunState, reason: str) -> None:
    """A ``CancelRun`` to each child still open at ``before``'s boundary: the parent stops."""
    run = maker.run
    for interaction in sorted(before.interactions.values(), key=lambda i: i.item_index):
        if interaction.boundary != before.boundary.number or interaction.status != "open":
            continue
        child = child_run_id(run.run_id, interaction.boundary, interaction.item_index)
        cancel = CancelRun(
            command_id=f"parent-stop/{child}",
            run_id=child,
            reason=f"parent run {run.run_id} stopped: {reason}",
            requested_ms=maker.now,
        )
        maker.emits.append(Emit(TopicName.COMMANDS, child, cancel))
