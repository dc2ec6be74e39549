"""Stop that reaches the work: what a committed stop tells workers and outside systems.

When stop intent commits (cancel, run deadline, failure) while the run's forward
attempt runs, a ``StopNotice`` goes to segments.control, which every worker reads:
the one running the attempt sets the step context's ``stop_requested``. When the
run waits at an await boundary, each open interaction gets a cancel notice on
boundary.requests: a ``BoundaryRequest`` whose ``cancel`` names the stop reason
(empty request and resume token), in the await's wire, so the external system can
stop too. A completion sent anyway is refused. An attempt the processor gave up as
lost (``AttemptLost``: its heartbeat stopped, it did not start in time) gets a
``StopNotice`` too, with reason ``attempt_lost``: if it still runs somewhere, its
step can see that its result will be refused. Pure.
"""

from __future__ import annotations

from processor.facts.models import BoundaryRequest, StopNotice
from processor.facts.topics import TopicName
from processor.model import children, waits
from processor.model.decision import FactMaker
from processor.model.pipeline_spec import PipelineSpec
from processor.model.state import FORWARD, Attempt, RunState

__all__ = ["LOST", "notify_lost", "notify_stop"]

#: The reason of the stop notice of a lost attempt.
LOST = "attempt_lost"


def notify_stop(maker: FactMaker, before: RunState, spec: PipelineSpec, reason: str) -> None:
    """The notices of a stop just committed on a run that was in ``before``'s wait."""
    for view in (before, *before.lane_views()):  # a graph run's: each step in flight
        wait = waits.of(view)
        if wait.runs == FORWARD:
            _notice(maker, view.attempt_of(FORWARD), reason)
        elif wait is waits.SUSPENDED:
            _cancel_interactions(maker, view, spec, reason)


def notify_lost(maker: FactMaker, attempt: Attempt) -> None:
    """The notice to a lost attempt, which may still run somewhere."""
    _notice(maker, attempt, LOST)


def _notice(maker: FactMaker, attempt: Attempt, reason: str) -> None:
    notice = StopNotice(
        run_id=maker.current.run_id,
        kind=attempt.kind,
        segment=attempt.scope,
        attempt=attempt.number,
        generation=attempt.generation,
        reason=reason,
        at_ms=maker.now,
    )
    maker.emit(TopicName.CONTROL, notice)


def _cancel_interactions(
    maker: FactMaker, before: RunState, spec: PipelineSpec, reason: str
) -> None:
    step = before.boundary.step
    awaits = spec.steps[step].awaits if step is not None and step <= spec.last_step else None
    if awaits is not None and awaits.kind == "child":
        children.cancel_children(maker, before, reason)  # model/children.py
        return
    if awaits is None or awaits.kind != "await":
        return  # a checkpoint handoff sent no request: there is no one to tell
    for interaction_id, interaction in sorted(before.interactions.items()):
        if interaction.boundary != before.boundary.number or interaction.status != "open":
            continue
        notice = BoundaryRequest(
            run_id=before.run_id,
            boundary=interaction.boundary,
            interaction=interaction_id,
            item_index=interaction.item_index,
            target=interaction.target,
            request=b"",
            deadline_ms=interaction.deadline_ms,
            resume_token="",
            cancel=reason,
        )
        maker.emit(TopicName.REQUESTS, notice, awaits.wire)
