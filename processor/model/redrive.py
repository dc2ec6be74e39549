"""Redrive: an operator gives a failed run a new attempt of its failed segment.

Seed 001: after a terminal failure, "an operator may use the explicit failed-execution
re-drive path"; "that re-drive is a new attempt and still needs normal idempotency
safeguards". Here it is the ``RedriveRun`` command on runs.commands and the
``RunRedriven`` fact, which keeps the provenance (command, operator, reason) and
what the run was before (its outcome, error and failed attempt).

Rules, in the order refusals are decided:

1. ``unknown_run``; then a command id already applied to the run gets the reply it
   got then (and redrives nothing again);
2. ``not_failed`` for a run that is running (a redriven one too), succeeded,
   cancelled or timed out;
3. ``compensated``: the run failed and its unwind ran (recovery other than
   NotRequired). The steps a redrive would keep were undone, so continuing from their
   outputs would build on effects that no longer exist; submit a new run instead;
4. ``deadline_elapsed``: the run's deadline has passed (the same policy as an explicit
   retry of an Unknown attempt): a redrive would only time out;
5. ``bad_step``: ``from_step`` must be a step index from 0 to the failed step.

A redrive starts a new segment (the next segment number, so a boundary it reaches
again gets new interactions and tokens) with the next generation: a late result of
the failed attempt is stale. The steps before ``from_step`` keep their outputs; the
first step runs on the output of the step before it (or the run input).
"""

from __future__ import annotations

from processor.facts import keys
from processor.facts.models import RedriveRun, RunRedriven
from processor.model import graph_run
from processor.model.decision import Context, Decision, FactMaker, Reply, refuse, replier
from processor.model.graph import Graph
from processor.model.graph_nodes import graph_of
from processor.model.operator import response
from processor.model.pipeline_spec import PipelineSpec
from processor.model.state import FAILED, RunState
from processor.model.transitions import start_attempt

__all__ = ["decide_redrive"]


def decide_redrive(command: RedriveRun, state: RunState | None, ctx: Context) -> Decision:
    """Redrive a failed run once per command id, or refuse with a reason."""
    reply = replier(command.command_id, command.run_id)
    if state is None:
        return refuse(reply, "unknown_run", f"no run {command.run_id}")
    recorded = state.redrives.get(command.command_id)
    if recorded is not None:
        return Decision(emits=(reply(False, None, "already applied", recorded.response),))
    refusal = _refusal(command, state, ctx, reply)
    if refusal is not None:
        return refusal
    spec = ctx.catalog.get(state.pipeline, state.pipeline_version)
    if spec is None:
        return refuse(reply, "unknown_pipeline", f"pipeline {state.pipeline!r} is not loaded")
    if state.graph:
        return _redrive_graph(command, state, spec, ctx, reply)
    from_step = _from_step(command, state)
    segment, generation = state.attempt.segment + 1, state.attempt.generation + 1
    ordinal = len(state.redrives) + 1
    answer = response(
        state, redrive=ordinal, from_step=from_step, segment=segment, generation=generation
    )
    maker = FactMaker(state, state.run_id, ctx.now, command.command_id, live=ctx.live_versions)
    maker.add(_redriven(maker, state, command, ordinal=ordinal, from_step=from_step, answer=answer))
    start_attempt(
        maker,
        spec,
        segment=segment,
        attempt=1,
        generation=generation,
        first_step=from_step,
        input=maker.current.last_output,
    )
    maker.emits.append(reply(True, None, None, answer))
    return maker.decision()


def _refusal(command: RedriveRun, state: RunState, ctx: Context, reply: Reply) -> Decision | None:
    if state.status != FAILED:
        detail = f"run {state.run_id} is {state.status} (phase {state.phase}): only a failed run"
        return refuse(reply, "not_failed", detail + " can be redriven")
    if state.compensation.started:
        detail = (
            f"run {state.run_id} failed and was unwound (recovery {state.recovery}): the "
            "steps a redrive would keep were undone; submit a new run instead"
        )
        return refuse(reply, "compensated", detail)
    if state.deadline_ms is not None and ctx.now >= state.deadline_ms:
        return refuse(reply, "deadline_elapsed", f"the run deadline {state.deadline_ms} passed")
    failed = _failed_step(state)
    last = failed if not state.graph else max(state.nodes, default=0)
    if state.graph and command.from_step is not None and command.from_step not in state.nodes:
        detail = f"from_step must be a step of the graph that ran (one of {sorted(state.nodes)})"
        return refuse(reply, "bad_step", f"{detail}, got {command.from_step}")
    if command.from_step is not None and not 0 <= command.from_step <= last:
        detail = f"from_step must be a step index from 0 to the failed step {failed}"
        return refuse(reply, "bad_step", f"{detail}, got {command.from_step}")
    return None


def _redrive_graph(
    command: RedriveRun, state: RunState, spec: PipelineSpec, ctx: Context, reply: Reply
) -> Decision:
    """A graph run again: its failed steps (or ``from_step``) and every step after them
    run again, planned as at the start; the others keep their outcomes and outputs."""
    graph = graph_of(spec)
    if command.from_step is not None:
        starts = [command.from_step]
    else:
        starts = [step for step, node in state.nodes.items() if node.status in _AGAIN]
    steps = rerun(graph, starts, state)
    ordinal = len(state.redrives) + 1
    from_step = min(starts, default=_failed_step(state))
    answer = response(state, redrive=ordinal, from_step=from_step, steps=list(steps))
    maker = FactMaker(state, state.run_id, ctx.now, command.command_id, live=ctx.live_versions)
    redriven = _redriven(maker, state, command, ordinal=ordinal, from_step=from_step, answer=answer)
    maker.add(redriven.model_copy(update={"steps": steps}))
    graph_run.advance(maker, spec)
    maker.emits.append(reply(True, None, None, answer))
    return maker.decision()


#: The outcomes a graph redrive runs again by default: failed and stopped steps.
_AGAIN = frozenset({"failed", "stopped"})


def rerun(graph: Graph, starts: list[int], state: RunState) -> tuple[int, ...]:
    """``starts`` and every step after them (their successors, handlers, routes), the
    steps a stop left unrun, and the finally steps: what a graph redrive runs again."""
    index = {node.name: i for i, node in enumerate(graph.nodes)}
    after: dict[int, set[int]] = {i: set() for i in range(len(graph.nodes))}
    for i, node in enumerate(graph.nodes):
        for need in graph.needs(node.name):
            after[index[need]].add(i)
        if node.catch is not None:
            after[i].add(index[node.catch])
    found = set(starts)
    found |= {i for i, node in enumerate(graph.nodes) if node.is_finally}
    found |= {i for i, node in state.nodes.items() if node.status in _AGAIN}
    pending = list(found)
    while pending:
        for successor in after[pending.pop()]:
            if successor not in found:
                found.add(successor)
                pending.append(successor)
    return tuple(sorted(i for i in found if i in state.nodes or i in starts))


def _failed_step(state: RunState) -> int:
    return state.failed_step if state.failed_step is not None else state.attempt.next_step


def _from_step(command: RedriveRun, state: RunState) -> int:
    return _failed_step(state) if command.from_step is None else command.from_step


def _redriven(
    maker: FactMaker,
    state: RunState,
    command: RedriveRun,
    *,
    ordinal: int,
    from_step: int,
    answer: str,
) -> RunRedriven:
    return RunRedriven(
        **maker.header(keys.redriven(ordinal)),
        redrive=ordinal,
        command_id=command.command_id,
        operator=command.operator,
        reason=command.reason,
        from_step=from_step,
        failed_step=_failed_step(state),
        previous_execution=state.execution or "Failed",
        previous_recovery=state.recovery or "NotRequired",
        previous_error=state.error,
        previous_error_type=state.error_type,
        previous_segment=state.attempt.segment,
        previous_attempt=state.attempt.number,
        previous_generation=state.attempt.generation,
        previous_attempts=state.failed_attempts,
        response=answer,
    )
