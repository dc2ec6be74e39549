"""The processor's spans of a run's trace, from what a commit made durable.

Spans are recorded after the commit (step 4 of the loop's commit), so an aborted
batch, processed again, records none twice. Each is a child of the run's
traceparent (the submit span's context, with OpenTelemetry on at the client):

- ``processor.await``: an interaction, from its request (its deadline minus the
  await step's timeout: the time it was dispatched) to its admitted completion
  or its timeout;
- ``processor.outcome``: the run, from its acceptance (RunSubmitted) to the fact
  that made it terminal.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from processor.facts.models import BoundaryCompletionAdmitted, FactHeader, InteractionTimedOut
from processor.model.decision import PipelineCatalog
from processor.model.state import SUCCEEDED, RunState
from processor.telemetry import tracing

__all__ = ["Traced", "record_spans"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Traced:
    """One committed decision of a run with a traceparent: the run before and after."""

    traceparent: str
    before: RunState | None
    after: RunState
    facts: tuple[FactHeader, ...]


def record_spans(traced: Sequence[Traced], catalog: PipelineCatalog) -> None:
    """Record the spans of committed decisions; a failure to do so is only logged."""
    try:
        for decision in traced:
            _record(decision, catalog)
    except Exception:  # telemetry must never stop the loop
        logger.exception("recording spans failed")


def _record(decision: Traced, catalog: PipelineCatalog) -> None:
    for fact in decision.facts:
        if isinstance(fact, BoundaryCompletionAdmitted | InteractionTimedOut):
            _await_span(decision, fact, catalog)
    was_terminal = decision.before is not None and decision.before.terminal
    if decision.after.terminal and not was_terminal:
        _outcome_span(decision)


def _await_span(
    decision: Traced,
    fact: BoundaryCompletionAdmitted | InteractionTimedOut,
    catalog: PipelineCatalog,
) -> None:
    run = decision.after
    interaction = run.interactions.get(fact.interaction)
    if interaction is None:
        return
    outcome = fact.outcome if isinstance(fact, BoundaryCompletionAdmitted) else "timed_out"
    tracing.record_span(
        "processor.await",
        decision.traceparent,
        _dispatched_ms(decision.before, interaction.deadline_ms, catalog) or fact.time_ms,
        fact.time_ms,
        {
            "run_id": run.run_id,
            "pipeline": run.pipeline,
            "boundary": interaction.boundary,
            "interaction": fact.interaction,
            "item_index": interaction.item_index,
            "target": interaction.target,
            "outcome": outcome,
        },
        error=None if outcome == "success" else outcome,
    )


def _dispatched_ms(run: RunState | None, deadline_ms: int, catalog: PipelineCatalog) -> int | None:
    """When the interaction's request went out: its deadline minus the step's timeout."""
    if run is None or run.boundary.step is None or deadline_ms == 0:
        return None
    spec = catalog.get(run.pipeline, run.pipeline_version)
    awaits = None if spec is None else spec.steps[run.boundary.step].awaits
    return None if awaits is None else deadline_ms - awaits.timeout_ms


def _outcome_span(decision: Traced) -> None:
    run = decision.after
    tracing.record_span(
        "processor.outcome",
        decision.traceparent,
        run.created_ms,
        run.updated_ms,
        {
            "run_id": run.run_id,
            "pipeline": run.pipeline,
            "status": run.status,
            "execution": run.execution or "",
            "recovery": run.recovery or "",
        },
        error=None if run.status == SUCCEEDED else (run.error or run.status),
    )
