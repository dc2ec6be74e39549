"""``GET /api/runs/{run_id}/graph?at_seq=``: a run drawn on its pipeline's graph, as of
its last fact or of any earlier one (time travel).

The run's history is read as the history route reads it (``Client.current``), the
facts up to ``at_seq`` are folded (``model.reduce.fold``), and the pure view
(``model/graph_view.py``) places the folded run on the graph of the pipeline version
it runs, which this processor must load.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from processor.facts.codec import decode_facts
from processor.facts.models import FactHeader
from processor.model.graph_view import compensated_steps, graph_view
from processor.model.reduce import fold
from processor.web.context import WebContext
from processor.web.errors import ApiError
from processor.web.models import ErrorBody, RunGraph
from processor.web.reads import shown_to

__all__ = ["graph_routes", "run_graph"]


def graph_routes(router: APIRouter, context: WebContext, reader: Any) -> None:
    @router.get(
        "/runs/{run_id}/graph",
        summary="A run on its pipeline's graph, as of its last fact or of fact at_seq",
        response_model=RunGraph,
        responses={400: {"model": ErrorBody}, 404: {"model": ErrorBody}, 409: {"model": ErrorBody}},
        dependencies=[reader],
    )
    def graph(
        request: Request,
        run_id: str,
        at_seq: Annotated[
            int | None, Query(description="As it was after this fact (default: the last)")
        ] = None,
    ) -> dict[str, Any]:
        with context.client() as client:
            history = client.current(run_id).history
        answer = run_graph(context, run_id, decode_facts(history), at_seq)
        shown: dict[str, Any] = shown_to(context, request)(answer)
        return shown


def run_graph(
    context: WebContext, run_id: str, facts: list[FactHeader], at_seq: int | None
) -> dict[str, Any]:
    """The answer of the graph route for a run's decoded ``facts``; ``ApiError`` if none."""
    if not facts:
        raise ApiError(404, "unknown_run", f"no run {run_id}")
    prefix = _prefix(facts, at_seq)
    state = fold(prefix)
    assert state is not None  # a non-empty history starts with its RunSubmitted
    spec = context.pipelines(state.pipeline, state.pipeline_version)
    if spec is None:
        raise ApiError(
            409,
            "pipeline_not_loaded",
            f"run {run_id} runs pipeline {state.pipeline!r} v{state.pipeline_version}, "
            "which this processor does not load: its graph is unknown here",
        )
    last = prefix[-1]
    return {
        "run_id": run_id,
        "pipeline": state.pipeline,
        "pipeline_version": state.pipeline_version,
        "status": state.status,
        "phase": state.phase,
        "seq": last.seq,
        "last_seq": facts[-1].seq,
        "fact": {"seq": last.seq, "type": type(last).__name__, "time_ms": last.time_ms},
        **graph_view(spec, state, compensated_steps(prefix)).as_dict(),
    }


def _prefix(facts: list[FactHeader], at_seq: int | None) -> list[FactHeader]:
    """The facts up to and including seq ``at_seq`` (all of them when None)."""
    if at_seq is None:
        return facts
    first, last = facts[0].seq, facts[-1].seq
    if not first <= at_seq <= last:
        raise ApiError(
            400,
            "bad_seq",
            f"at_seq must be a seq of this run's facts, {first} to {last}; got {at_seq}",
        )
    return [fact for fact in facts if fact.seq <= at_seq]
