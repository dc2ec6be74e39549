"""Fold facts into the run projection. Pure, total on valid facts, idempotent.

A fact whose sequence number is not above the run's version was already folded
and changes nothing, so folding the facts twice equals folding them once.
Unknown fact types only advance the version: an old reader survives a newer writer.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any, TypeVar, cast

from processor.facts.models import (
    AttemptOutcomeUnknown,
    AttemptResolved,
    BoundaryCompletionAdmitted,
    BoundaryDispatchCompleted,
    BoundaryInteractionDispatched,
    CompensationAttemptFailed,
    CompensationAttemptStarted,
    CompensationStarted,
    CompensationStepCompleted,
    CompensationStepSkipped,
    ContinuationSegmentCreated,
    FactHeader,
    InteractionTimedOut,
    RetryScheduled,
    RunFailed,
    RunStopped,
    RunStopRequested,
    RunSubmitted,
    RunSucceeded,
    SegmentAttemptStarted,
    SegmentCompleted,
    SegmentFailed,
    SegmentSuspended,
    StepCompleted,
    TerminalPublicationCompleted,
    TerminalPublicationPrepared,
)
from processor.facts.trusted import assemble, evolve
from processor.model.state import (
    FAILED,
    SUCCEEDED,
    Interaction,
    RecordedResolution,
    RunState,
    UnknownAttempt,
)

__all__ = ["fold", "journal_facts", "reduce"]


def reduce(state: RunState | None, fact: FactHeader) -> RunState | None:
    """The next projection of the run after ``fact``."""
    return fold((fact,), state)


def fold(facts: Iterable[FactHeader], state: RunState | None = None) -> RunState | None:
    """Fold a run's facts in order, building the next projection once.

    The same as reducing one fact at a time: each fact's changes are computed
    against a draft that already includes the earlier facts' changes.
    """
    draft: _Draft | None = None
    for fact in facts:
        if state is None:
            state = _start(fact)
            continue
        if draft is None:
            draft = _Draft(state)
        if fact.seq <= draft.version:
            continue  # already folded: duplicates change nothing
        changes = _changes(fact, cast(RunState, draft))
        changes["version"] = fact.seq
        changes["updated_ms"] = fact.time_ms
        draft.apply(changes)
    if state is None or draft is None or not draft.updates:
        return state
    return evolve(state, draft.updates)


class _Draft:
    """A run with changes not yet applied, read like the RunState it will become.

    Its attributes are the state's fields with the changes so far applied (a plain
    instance dictionary: reading one costs what reading a RunState field costs).
    """

    def __init__(self, state: RunState) -> None:
        self.__dict__.update(state.__dict__)
        self.updates: dict[str, Any] = {}

    def apply(self, changes: dict[str, Any]) -> None:
        self.__dict__.update(changes)
        self.updates.update(changes)

    def __getattr__(self, name: str) -> Any:
        # Only what is not a field: RunState's properties and methods, on a built copy.
        state = RunState.model_construct(**{f: self.__dict__[f] for f in RunState.model_fields})
        return getattr(state, name)


def journal_facts(facts: Iterable[F], state: RunState | None) -> list[F]:
    """The facts of one run, in order, that are new to its journal after ``state``.

    ``fold`` skips a fact at or below the run's version: a duplicate. Before the run
    starts (no state, no RunSubmitted yet) every fact is new, though the fold keeps
    none of those orphans. The store records exactly these in the run's history.
    """
    version = None if state is None else state.version
    new = []
    for fact in facts:
        if version is not None and fact.seq <= version:
            continue
        new.append(fact)
        if version is not None or isinstance(fact, RunSubmitted):
            version = fact.seq
    return new


def _start(fact: FactHeader) -> RunState | None:
    if not isinstance(fact, RunSubmitted):
        return None  # a run begins with its submission; anything else is orphaned
    # The values come from a validated fact, with the types RunState declares.
    return assemble(
        RunState,
        {
            "run_id": fact.run_id,
            "pipeline": fact.pipeline,
            "pipeline_version": fact.pipeline_version,
            "version": fact.seq,
            "input": fact.input,
            "submitted_ms": fact.submitted_ms,
            "created_ms": fact.time_ms,
            "updated_ms": fact.time_ms,
            "idempotency_key": fact.idempotency_key,
            "fingerprint": fact.fingerprint,
            "submit_command_id": fact.cause_id,
            "last_output": fact.input,
            "deadline_ms": fact.deadline_ms,
        },
    )


F = TypeVar("F", bound=FactHeader)


@functools.singledispatch
def _changes(fact: FactHeader, state: RunState) -> dict[str, object]:
    """The fact's changes to the run, by fact type (each type registers its own).

    A type without a reducer only advances the version: an old reader survives a
    newer writer.
    """
    return {}


@_changes.register
def _(fact: SegmentAttemptStarted, state: RunState) -> dict[str, object]:
    return {
        "segment": fact.segment,
        "attempt": fact.attempt,
        "generation": fact.generation,
        "next_step": fact.first_step,
        "step_attempts": state.step_attempts + 1,
        "phase": "dispatched",
        "attempt_expires_ms": fact.expires_ms,
        "retry_due_ms": None,
    }


@_changes.register
def _(fact: StepCompleted, state: RunState) -> dict[str, object]:
    return {
        "next_step": fact.step + 1,
        "step_attempts": 1,  # the attempt that completed this step now tries the next
        "last_output": fact.output,
        "completed_steps": (*state.completed_steps, fact.step),
        "step_outputs": {**state.step_outputs, fact.step: fact.output},
    }


@_changes.register
def _(fact: SegmentCompleted, state: RunState) -> dict[str, object]:
    return {"phase": "idle", "attempt_expires_ms": None, "unknown": None}


@_changes.register
def _(fact: SegmentFailed, state: RunState) -> dict[str, object]:
    return {
        "phase": "idle",
        "unknown": None,
        "attempt_expires_ms": None,
        "error": fact.error,
        "error_type": fact.error_type,
        "failed_step": fact.step,
    }


@_changes.register
def _(fact: RetryScheduled, state: RunState) -> dict[str, object]:
    return {"phase": "retry_wait", "retry_due_ms": fact.due_ms}


@_changes.register
def _(fact: SegmentSuspended, state: RunState) -> dict[str, object]:
    return {
        "phase": "suspended",
        "unknown": None,
        "attempt_expires_ms": None,
        "next_step": fact.step,
        "boundary": fact.boundary,
        "boundary_step": fact.step,
        "boundary_kind": fact.kind,
        "boundary_itemized": fact.itemized,
        "boundary_items": fact.items,
        "boundary_on_timeout": fact.on_timeout,
        "boundary_dispatched": False,
    }


@_changes.register
def _(fact: BoundaryInteractionDispatched, state: RunState) -> dict[str, object]:
    interaction = assemble(
        Interaction,
        {
            "boundary": fact.boundary,
            "item_index": fact.item_index,
            "kind": state.boundary_kind,
            "target": fact.target,
            "deadline_ms": fact.deadline_ms,
            "token_digest": fact.token_digest,
        },
    )
    return {"interactions": {**state.interactions, fact.interaction: interaction}}


@_changes.register
def _(fact: BoundaryDispatchCompleted, state: RunState) -> dict[str, object]:
    return {"boundary_dispatched": True}


def _settle(state: RunState, interaction_id: str, **changes: object) -> dict[str, object]:
    current = state.interactions.get(interaction_id)
    if current is None:
        return {}
    settled = evolve(current, changes)
    return {"interactions": {**state.interactions, interaction_id: settled}}


@_changes.register
def _(fact: BoundaryCompletionAdmitted, state: RunState) -> dict[str, object]:
    return _settle(state, fact.interaction, **_admitted(fact))


def _admitted(fact: BoundaryCompletionAdmitted) -> dict[str, object]:
    output = fact.payload if fact.outcome == "success" else None
    return {
        "status": "admitted",
        "outcome": fact.outcome,
        "digest": fact.payload_digest,
        "output": output,
        "error": fact.error,
    }


@_changes.register
def _(fact: InteractionTimedOut, state: RunState) -> dict[str, object]:
    return _settle(state, fact.interaction, status="timed_out")


@_changes.register
def _(fact: ContinuationSegmentCreated, state: RunState) -> dict[str, object]:
    released = {
        key: (evolve(i, {"output": None}) if i.boundary == fact.boundary else i)
        for key, i in state.interactions.items()
    }
    return {
        "phase": "idle",
        "segment": fact.segment,
        "attempt": 0,
        "next_step": fact.first_step,
        "step_attempts": 0,
        "last_output": fact.input,
        "interactions": released,
    }


@_changes.register
def _(fact: TerminalPublicationPrepared, state: RunState) -> dict[str, object]:
    return {
        "phase": "publishing",
        "publications": {**state.publications, fact.topic: "prepared"},
        "publication_key": fact.idempotency_key,
        "publication_due_ms": fact.time_ms,
    }


@_changes.register
def _(fact: TerminalPublicationCompleted, state: RunState) -> dict[str, object]:
    return {"publications": {**state.publications, fact.topic: "completed"}}


@_changes.register
def _(fact: RunSucceeded, state: RunState) -> dict[str, object]:
    return {
        "status": SUCCEEDED,
        "execution": "Completed",
        "recovery": "NotRequired",
        "phase": "idle",
        "result": fact.result,
        "error": None,
        "error_type": None,
        "failed_step": None,
    }


@_changes.register
def _(fact: RunFailed, state: RunState) -> dict[str, object]:
    return {
        "status": FAILED,
        "execution": "Failed",
        "recovery": fact.recovery,
        "failed_attempts": fact.attempts,
        "phase": "idle",
        "retry_due_ms": None,
        "error": fact.error,
        "error_type": fact.error_type,
        "failed_step": fact.step,
    }


@_changes.register
def _(fact: RunStopRequested, state: RunState) -> dict[str, object]:
    # Queued forward work and open interactions are fenced: their timers disappear
    # from the due index (see due.py); a running attempt keeps settling.
    fenced = state.phase in ("retry_wait", "suspended")
    return {
        "stop_reason": fact.reason,
        "stop_detail": fact.detail,
        "phase": "idle" if fenced else state.phase,
        "retry_due_ms": None,
    }


@_changes.register
def _(fact: AttemptOutcomeUnknown, state: RunState) -> dict[str, object]:
    unknown = UnknownAttempt(
        kind=fact.kind,
        segment=fact.segment,
        attempt=fact.attempt,
        generation=fact.generation,
        step=fact.step,
    )
    return {
        "phase": "unknown",
        "unknown": unknown,
        "attempt_expires_ms": None,
        "compensation_expires_ms": None,
    }


@_changes.register
def _(fact: AttemptResolved, state: RunState) -> dict[str, object]:
    recorded = RecordedResolution(fingerprint=fact.fingerprint, response=fact.response)
    return {
        "phase": "idle",
        "unknown": None,
        "resolutions": {**state.resolutions, fact.idempotency_key: recorded},
    }


@_changes.register
def _(fact: CompensationStarted, state: RunState) -> dict[str, object]:
    return {"phase": "compensating", "unwind": fact.steps, "compensation_started": True}


@_changes.register
def _(fact: CompensationAttemptStarted, state: RunState) -> dict[str, object]:
    return {
        "phase": "compensating",
        "compensating_step": fact.step,
        "compensation_attempt": fact.attempt,
        "compensation_generation": fact.generation,
        "compensation_expires_ms": fact.expires_ms,
        "compensation_retry_due_ms": None,
    }


def _unwound(state: RunState) -> dict[str, object]:
    return {
        "unwind": state.unwind[1:],
        "compensating_step": None,
        "compensation_attempt": 0,
        "compensation_generation": 0,
        "compensation_expires_ms": None,
        "phase": "compensating",
    }


@_changes.register
def _(fact: CompensationStepCompleted, state: RunState) -> dict[str, object]:
    return {**_unwound(state), "compensated": state.compensated + 1}


@_changes.register
def _(fact: CompensationStepSkipped, state: RunState) -> dict[str, object]:
    return {**_unwound(state), "skipped": state.skipped + 1}


@_changes.register
def _(fact: CompensationAttemptFailed, state: RunState) -> dict[str, object]:
    if fact.retry_due_ms is not None:
        return {
            "phase": "compensation_retry_wait",
            "compensation_retry_due_ms": fact.retry_due_ms,
            "compensation_expires_ms": None,
        }
    return {
        "compensation_failed": True,
        "unwind": (),
        "compensation_expires_ms": None,
        "phase": "idle",
    }


@_changes.register
def _(fact: RunStopped, state: RunState) -> dict[str, object]:
    return {
        "status": "cancelled" if fact.execution == "Cancelled" else "timed_out",
        "execution": fact.execution,
        "recovery": fact.recovery,
        "phase": "idle",
        "attempt_expires_ms": None,
        "retry_due_ms": None,
    }
