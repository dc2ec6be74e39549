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
    AttemptHeartbeatRecorded,
    AttemptLost,
    AttemptOutcomeUnknown,
    AttemptResolved,
    AttemptStepStarted,
    BoundaryCompletionAdmitted,
    BoundaryDispatchCompleted,
    BoundaryInteractionDispatched,
    BoundaryInteractionQueued,
    CatchDecided,
    ChildRunLinked,
    CompensationAttemptFailed,
    CompensationAttemptStarted,
    CompensationStarted,
    CompensationStepCompleted,
    CompensationStepSkipped,
    ContinuationSegmentCreated,
    FactHeader,
    FanOutItemSettled,
    GraphSettled,
    InteractionTimedOut,
    NodeReady,
    NodeSettled,
    NodeSkipped,
    RetryScheduled,
    RouteDecided,
    RunDefinitionBlocked,
    RunFailed,
    RunQuarantined,
    RunRedriven,
    RunReleased,
    RunStopped,
    RunStopRequested,
    RunSubmitted,
    RunSucceeded,
    ScheduledRunLinked,
    SegmentAttemptStarted,
    SegmentCompleted,
    SegmentFailed,
    SegmentSuspended,
    SleepCompleted,
    SleepStarted,
    StepCompleted,
    TerminalPublicationCompleted,
    TerminalPublicationPrepared,
)
from processor.model import waits
from processor.model.chunked_map import ChunkedMap
from processor.model.lanes import items_of_step, segment_of
from processor.model.parent_link import ParentLink
from processor.model.schedule_link import ScheduleLink
from processor.model.state import (
    COMPENSATE,
    FAILED,
    FORWARD,
    LANE_FIELDS,
    RUNNING,
    SUCCEEDED,
    Boundary,
    CompensationChanges,
    ForwardAttempt,
    Interaction,
    InteractionChanges,
    Lane,
    LaneChanges,
    NodeRun,
    NodeRunChanges,
    NodeStatus,
    Phase,
    Publication,
    Quarantine,
    RecordedResolution,
    RunChanges,
    RunState,
    Sleep,
    Stop,
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
    updates: RunChanges = {}
    for fact in facts:
        if state is None:
            state = _start(fact)
            continue
        if draft is None:
            draft = _Draft(state)
            # Both once, not per fact: cast is a call, and an attribute lookup on the draft
            # takes the slow path of a class with __getattr__.
            read, fields = cast(RunState, draft), draft.__dict__
        if fact.seq <= fields["version"]:
            continue  # already folded: duplicates change nothing
        if fields["lanes"]:
            changes = _in_lanes(fact, read, fields)
        else:
            changes = _reducer_of(type(fact), _changes)(fact, read)
        changes["version"] = fact.seq
        changes["updated_ms"] = fact.time_ms
        fields.update(changes)
        updates.update(changes)
    if state is None or not updates:
        return state
    return state.evolve(updates)


class _Draft:
    """A run with changes not yet applied, read like the RunState it will become.

    Its attributes are the state's fields with the changes so far applied (a plain
    instance dictionary: reading one costs what reading a RunState field costs).
    """

    def __init__(self, state: RunState) -> None:
        self.__dict__.update(state.__dict__)

    def __getattr__(self, name: str) -> Any:
        # Only what is not a field: RunState's properties and methods, on a built copy.
        state = RunState.model_construct(**{f: self.__dict__[f] for f in RunState.model_fields})
        return getattr(state, name)


def _in_lanes(fact: FactHeader, read: RunState, fields: dict[str, Any]) -> RunChanges:
    """A graph run's changes: a fact about a forward attempt changes the lane of its
    segment, as it would change a chain's flat fields; stop intent meets every lane."""
    reducer = _reducer_of(type(fact), _changes)
    lanes: dict[int, Lane] = fields["lanes"]
    addressed = _LANE_FACTS.get(type(fact))
    segment = None if addressed is None else getattr(fact, addressed)
    # (A compensator's facts name its step as their segment: never a lane's.)
    if segment in lanes and getattr(fact, "kind", FORWARD) != COMPENSATE:
        assert segment is not None
        changes = _in_lane(reducer, fact, fields, segment)
        changes["lanes"] = {**lanes, segment: changes["lanes"][segment]}
        return changes
    changes = reducer(fact, read)
    if isinstance(fact, RunStopRequested):
        met = {
            segment: _in_lane(reducer, fact, fields, segment)["lanes"][segment] for segment in lanes
        }
        changes["lanes"] = met
    return changes


#: The facts about a segment's attempt, its boundary or its sleep, and the field that
#: names the segment: in a graph run, they are about that lane (a lane's boundary is
#: numbered by its segment).
_LANE_FACTS: dict[type[FactHeader], str] = {
    **dict.fromkeys(
        (
            SegmentAttemptStarted,
            AttemptStepStarted,
            AttemptHeartbeatRecorded,
            AttemptLost,
            RunDefinitionBlocked,
            StepCompleted,
            SegmentCompleted,
            SegmentFailed,
            RetryScheduled,
            SegmentSuspended,
            SleepStarted,
            SleepCompleted,
            AttemptOutcomeUnknown,
            AttemptResolved,
        ),
        "segment",
    ),
    BoundaryInteractionDispatched: "boundary",
    BoundaryInteractionQueued: "boundary",
    BoundaryDispatchCompleted: "boundary",
    BoundaryCompletionAdmitted: "boundary",
    InteractionTimedOut: "boundary",
}


def _in_lane(reducer: Any, fact: FactHeader, fields: dict[str, Any], segment: int) -> RunChanges:
    """The fact's changes seen from lane ``segment``: its lane fields go to the lane."""
    lane: Lane = fields["lanes"][segment]
    view = _Draft.__new__(_Draft)
    view.__dict__.update(fields)
    view.__dict__.update(lane.__dict__)
    changes: dict[str, Any] = dict(reducer(fact, cast(RunState, view)))
    moved = {name: changes.pop(name) for name in LANE_FIELDS if name in changes}
    changes["lanes"] = {segment: lane.evolve(cast(LaneChanges, moved))}
    return cast(RunChanges, changes)


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
    return RunState.assemble(
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
            "traceparent": fact.traceparent,
        },
    )


F = TypeVar("F", bound=FactHeader)


@functools.singledispatch
def _changes(fact: FactHeader, state: RunState) -> RunChanges:
    """The fact's changes to the run, by fact type (each type registers its own).

    A type without a reducer only advances the version: an old reader survives a
    newer writer.
    """
    return {}


#: The reducer of each fact type, looked up by exact type: facts are never subclassed,
#: and the registry's own lookup skips singledispatch's wrapper (a tenth of a live
#: fold's time); a type without a reducer gets the default above.
_reducer_of = _changes.registry.get


@_changes.register
def _(fact: SegmentAttemptStarted, state: RunState) -> RunChanges:
    forward = state.attempt
    attempt = forward.evolve(
        {
            "segment": fact.segment,
            "number": fact.attempt,
            "generation": fact.generation,
            "next_step": fact.first_step,
            "step_attempts": forward.step_attempts + 1,
            "expires_ms": fact.expires_ms,
            "retry_due_ms": None,
            "started_step": None,
            "worker_id": None,
            "heartbeat_due_ms": None,
        },
    )
    return {"phase": "dispatched", "attempt": attempt}


@_changes.register
def _(fact: AttemptStepStarted, state: RunState) -> RunChanges:
    changes: RunChanges
    if fact.kind == COMPENSATE:
        compensation = state.compensation.evolve(
            {
                "worker_id": fact.worker_id,
                "expires_ms": fact.expires_ms,
                "heartbeat_due_ms": fact.heartbeat_due_ms,
            }
        )
        changes = {"compensation": compensation}
    else:
        attempt = state.attempt.evolve(
            {
                "started_step": fact.step,
                "worker_id": fact.worker_id,
                "expires_ms": fact.expires_ms,
                "heartbeat_due_ms": fact.heartbeat_due_ms,
            }
        )
        changes = {"attempt": attempt}
    if fact.redelivered:
        changes["infrastructure_losses"] = state.infrastructure_losses + 1
    return changes


@_changes.register
def _(fact: AttemptHeartbeatRecorded, state: RunState) -> RunChanges:
    due = fact.heartbeat_due_ms
    if fact.kind == COMPENSATE:
        return {"compensation": state.compensation.evolve({"heartbeat_due_ms": due})}
    return {"attempt": state.attempt.evolve({"heartbeat_due_ms": due})}


@_changes.register
def _(fact: AttemptLost, state: RunState) -> RunChanges:
    if fact.kind == COMPENSATE:
        # The compensator is dispatched again in the same commit, under the same attempt
        # number: its retry budget is not charged.
        compensation = state.compensation.evolve({"expires_ms": None, "heartbeat_due_ms": None})
        return {"compensation": compensation, "infrastructure_losses": fact.losses}
    # The lost attempt is given back to the step's retry budget: the next one (started
    # at once) counts again the attempt this one counted.
    forward = state.attempt
    attempt = forward.evolve(
        {
            "expires_ms": None,
            "heartbeat_due_ms": None,
            "step_attempts": max(0, forward.step_attempts - 1),
        }
    )
    return {"phase": "idle", "attempt": attempt, "infrastructure_losses": fact.losses}


@_changes.register
def _(fact: RunDefinitionBlocked, state: RunState) -> RunChanges:
    # The attempt named waits, not started: no expiry, the budget without it.
    attempt = state.attempt.evolve(
        {
            "segment": fact.segment,
            "number": fact.attempt,
            "generation": fact.generation,
            "next_step": fact.first_step,
            "step_attempts": fact.step_attempts,
            "expires_ms": None,
            "retry_due_ms": None,
        },
    )
    return {"phase": "definition_blocked", "attempt": attempt, "unknown": None}


@_changes.register
def _(fact: ChildRunLinked, state: RunState) -> RunChanges:
    return {
        "parent": ParentLink(run_id=fact.parent_run_id, token=fact.parent_token, depth=fact.depth)
    }


@_changes.register
def _(fact: ScheduledRunLinked, state: RunState) -> RunChanges:
    return {"schedule": ScheduleLink(schedule_id=fact.schedule_id, fire_ms=fact.fire_ms)}


@_changes.register
def _(fact: StepCompleted, state: RunState) -> RunChanges:
    # The attempt that completed this step now tries the next.
    attempt = state.attempt.evolve({"next_step": fact.step + 1, "step_attempts": 1})
    return {
        "attempt": attempt,
        "last_output": fact.output,
        "completed_steps": (*state.completed_steps, fact.step),
        "step_outputs": {**state.step_outputs, fact.step: fact.output},
    }


@_changes.register
def _(fact: SegmentCompleted, state: RunState) -> RunChanges:
    return {"phase": "idle", "attempt": _settled(state), "unknown": None}


def _settled(state: RunState) -> ForwardAttempt:
    """The forward attempt once it has settled: no expiry (nor heartbeat timer) any more."""
    attempt = state.attempt
    if attempt.expires_ms is None and attempt.heartbeat_due_ms is None:
        return attempt
    return attempt.evolve({"expires_ms": None, "heartbeat_due_ms": None})


def _with_reason(attempt: ForwardAttempt, reason: str | None) -> ForwardAttempt:
    """The attempt with the retry decision ``reason`` (None: a fact from before reasons)."""
    return attempt if reason is None else attempt.evolve({"retry_reason": reason})


@_changes.register
def _(fact: SegmentFailed, state: RunState) -> RunChanges:
    return {
        "phase": "idle",
        "unknown": None,
        "attempt": _with_reason(_settled(state), fact.reason),
        "error": fact.error,
        "error_type": fact.error_type,
        "failed_step": fact.step,
    }


@_changes.register
def _(fact: RetryScheduled, state: RunState) -> RunChanges:
    attempt = _with_reason(state.attempt.evolve({"retry_due_ms": fact.due_ms}), fact.reason)
    return {"phase": "retry_wait", "attempt": attempt}


@_changes.register
def _(fact: SegmentSuspended, state: RunState) -> RunChanges:
    attempt = state.attempt.evolve(
        {"expires_ms": None, "heartbeat_due_ms": None, "next_step": fact.step}
    )
    boundary = Boundary.assemble(
        {
            "number": fact.boundary,
            "step": fact.step,
            "kind": fact.kind,
            "itemized": fact.itemized,
            "items": fact.items,
            "on_timeout": fact.on_timeout,
            "dispatched": False,
        },
    ).counted(state.interactions.values())  # none, unless the boundary is reached again
    return {"phase": "suspended", "unknown": None, "attempt": attempt, "boundary": boundary}


@_changes.register
def _(fact: BoundaryInteractionDispatched, state: RunState) -> RunChanges:
    interaction = Interaction.assemble(
        {
            "boundary": fact.boundary,
            "item_index": fact.item_index,
            "kind": state.boundary.kind,
            "target": fact.target,
            "deadline_ms": fact.deadline_ms,
            "token_digest": fact.token_digest,
        },
    )
    return _put(state, fact.interaction, interaction)


@_changes.register
def _(fact: BoundaryInteractionQueued, state: RunState) -> RunChanges:
    interaction = Interaction.assemble(
        {
            "boundary": fact.boundary,
            "item_index": fact.item_index,
            "kind": state.boundary.kind,
            "target": fact.target,
            "deadline_ms": 0,
            "token_digest": b"",
            "status": "queued",
            "request": fact.request,
        },
    )
    return _put(state, fact.interaction, interaction)


@_changes.register
def _(fact: BoundaryDispatchCompleted, state: RunState) -> RunChanges:
    return {"boundary": state.boundary.evolve({"dispatched": True})}


def _settle(state: RunState, interaction_id: str, changes: InteractionChanges) -> RunChanges:
    current = state.interactions.get(interaction_id)
    if current is None:
        return {}
    return _put(state, interaction_id, current.evolve(changes))


def _put(state: RunState, interaction_id: str, interaction: Interaction) -> RunChanges:
    """``interaction`` in the run's interactions, counted by its boundary (in a graph
    run, the lane's: these facts are its lane's, ``_LANE_FACTS``)."""
    before = state.interactions.get(interaction_id)
    return {
        "interactions": state.interactions.with_item(interaction_id, interaction),
        "boundary": state.boundary.recounted(before, interaction),
    }


@_changes.register
def _(fact: BoundaryCompletionAdmitted, state: RunState) -> RunChanges:
    return _settle(state, fact.interaction, _admitted(fact))


def _admitted(fact: BoundaryCompletionAdmitted) -> InteractionChanges:
    output = fact.payload if fact.outcome == "success" else None
    return {
        "status": "admitted",
        "outcome": fact.outcome,
        "digest": fact.payload_digest,
        "output": output,
        "error": fact.error,
    }


@_changes.register
def _(fact: InteractionTimedOut, state: RunState) -> RunChanges:
    return _settle(state, fact.interaction, {"status": "timed_out"})


@_changes.register
def _(fact: ContinuationSegmentCreated, state: RunState) -> RunChanges:
    released = ChunkedMap.adopting(
        {
            key: (i.evolve({"output": None}) if i.boundary == fact.boundary else i)
            for key, i in state.interactions.items()
        }
    )
    attempt = state.attempt.evolve(
        {"segment": fact.segment, "number": 0, "next_step": fact.first_step, "step_attempts": 0}
    )
    return {
        "phase": "idle",
        "attempt": attempt,
        "last_output": fact.input,
        "interactions": released,
    }


@_changes.register
def _(fact: TerminalPublicationPrepared, state: RunState) -> RunChanges:
    targets = {**state.publication.targets, fact.topic: "prepared"}
    publication = Publication.assemble(
        {"targets": targets, "key": fact.idempotency_key, "due_ms": fact.time_ms}
    )
    return {"phase": "publishing", "publication": publication}


@_changes.register
def _(fact: TerminalPublicationCompleted, state: RunState) -> RunChanges:
    publication = state.publication
    targets = {**publication.targets, fact.topic: "completed"}
    return {"publication": publication.evolve({"targets": targets})}


@_changes.register
def _(fact: RunSucceeded, state: RunState) -> RunChanges:
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
def _(fact: RunFailed, state: RunState) -> RunChanges:
    return {
        "status": FAILED,
        "execution": "Failed",
        "recovery": fact.recovery,
        "failed_attempts": fact.attempts,
        "phase": "idle",
        "attempt": _with_reason(_no_retry(state), fact.reason),
        "error": fact.error,
        "error_type": fact.error_type,
        "failed_step": fact.step,
    }


def _no_retry(state: RunState) -> ForwardAttempt:
    attempt = state.attempt
    return attempt if attempt.retry_due_ms is None else attempt.evolve({"retry_due_ms": None})


#: A stop that fences a pending retry: the retry reason it gets.
_FENCED_RETRY_REASONS = {"timed_out": "deadline_elapsed", "cancelled": "cancelled"}


@_changes.register
def _(fact: RunStopRequested, state: RunState) -> RunChanges:
    # The waits that stop intent fences (``waits.py``: queued forward work, a run
    # blocked on its version, open interactions, a sleep) end: their timers disappear
    # from the due index; a running attempt keeps settling.
    wait = waits.of(state)
    fenced = wait.fenced and not waits.held_by_stop(state)  # open children hold it
    attempt = _no_retry(state)
    if fenced and wait.retries == FORWARD:
        attempt = _with_reason(attempt, _FENCED_RETRY_REASONS.get(fact.reason))
    changes: RunChanges = {
        "stop": Stop.assemble({"reason": fact.reason, "detail": fact.detail}),
        "phase": "idle" if fenced else state.phase,
        "attempt": attempt,
    }
    if wait is waits.SLEEPING:
        changes["sleep"] = Sleep()
    return changes


@_changes.register
def _(fact: SleepStarted, state: RunState) -> RunChanges:
    attempt = state.attempt.evolve({"expires_ms": None, "next_step": fact.step})
    sleep = Sleep.assemble({"step": fact.step, "wake_ms": fact.wake_ms})
    return {"phase": "sleeping", "unknown": None, "attempt": attempt, "sleep": sleep}


@_changes.register
def _(fact: SleepCompleted, state: RunState) -> RunChanges:
    return {"phase": "idle", "sleep": Sleep()}


@_changes.register
def _(fact: AttemptOutcomeUnknown, state: RunState) -> RunChanges:
    unknown = UnknownAttempt(
        kind=fact.kind,
        segment=fact.segment,
        attempt=fact.attempt,
        generation=fact.generation,
        step=fact.step,
    )
    compensation = state.compensation
    if compensation.expires_ms is not None or compensation.heartbeat_due_ms is not None:
        compensation = compensation.evolve({"expires_ms": None, "heartbeat_due_ms": None})
    attempt = _settled(state)
    if fact.kind == "forward":  # an effectful step's attempt: never retried blindly
        attempt = _with_reason(attempt, "outcome_unknown")
    return {
        "phase": "unknown",
        "unknown": unknown,
        "attempt": attempt,
        "compensation": compensation,
    }


@_changes.register
def _(fact: AttemptResolved, state: RunState) -> RunChanges:
    recorded = RecordedResolution(fingerprint=fact.fingerprint, response=fact.response)
    return {
        "phase": "idle",
        "unknown": None,
        "resolutions": {**state.resolutions, fact.idempotency_key: recorded},
    }


@_changes.register
def _(fact: CompensationStarted, state: RunState) -> RunChanges:
    compensation = state.compensation.evolve({"unwind": fact.steps, "started": True})
    return {"phase": "compensating", "compensation": compensation}


@_changes.register
def _(fact: CompensationAttemptStarted, state: RunState) -> RunChanges:
    compensation = state.compensation.evolve(
        {
            "step": fact.step,
            "attempt": fact.attempt,
            "generation": fact.generation,
            "expires_ms": fact.expires_ms,
            "retry_due_ms": None,
            "worker_id": None,
            "heartbeat_due_ms": None,
        },
    )
    return {"phase": "compensating", "compensation": compensation}


def _unwound(state: RunState, tally: CompensationChanges) -> RunChanges:
    """The step at the head of the unwind is done (``tally``: compensated or skipped)."""
    compensation = state.compensation
    changes: CompensationChanges = {
        "unwind": compensation.unwind[1:],
        "step": None,
        "attempt": 0,
        "generation": 0,
        "expires_ms": None,
        "worker_id": None,
        "heartbeat_due_ms": None,
        **tally,
    }
    return {"phase": "compensating", "compensation": compensation.evolve(changes)}


@_changes.register
def _(fact: CompensationStepCompleted, state: RunState) -> RunChanges:
    return _unwound(state, {"compensated": state.compensation.compensated + 1})


@_changes.register
def _(fact: CompensationStepSkipped, state: RunState) -> RunChanges:
    return _unwound(state, {"skipped": state.compensation.skipped + 1})


@_changes.register
def _(fact: CompensationAttemptFailed, state: RunState) -> RunChanges:
    compensation = state.compensation
    changes: CompensationChanges
    phase: Phase
    if fact.retry_due_ms is not None:
        changes = {"retry_due_ms": fact.retry_due_ms, "expires_ms": None, "heartbeat_due_ms": None}
        phase = "compensation_retry_wait"
    else:
        changes = {"failed": True, "unwind": (), "expires_ms": None, "heartbeat_due_ms": None}
        phase = "idle"
    if fact.reason is not None:
        changes["retry_reason"] = fact.reason
    return {"phase": phase, "compensation": compensation.evolve(changes)}


@_changes.register
def _(fact: RunStopped, state: RunState) -> RunChanges:
    attempt = state.attempt
    if attempt.expires_ms is not None or attempt.retry_due_ms is not None:
        attempt = attempt.evolve(
            {"expires_ms": None, "retry_due_ms": None, "heartbeat_due_ms": None}
        )
    return {
        "status": "cancelled" if fact.execution == "Cancelled" else "timed_out",
        "execution": fact.execution,
        "recovery": fact.recovery,
        "phase": "idle",
        "attempt": attempt,
    }


@_changes.register
def _(fact: RunRedriven, state: RunState) -> RunChanges:
    # Running again from ``from_step``: the steps before it keep their outputs, the
    # failure is cleared (the fact keeps it), the retry budget starts afresh.
    again = set(fact.steps)  # a graph run's steps that run again; a chain's: from_step on
    if again:
        kept = {step: out for step, out in state.step_outputs.items() if step not in again}
    else:
        kept = {step: out for step, out in state.step_outputs.items() if step < fact.from_step}
    last_output = kept.get(fact.from_step - 1, state.input) if fact.from_step > 0 else state.input
    attempt = state.attempt.evolve(
        {
            "next_step": fact.from_step,
            "step_attempts": 0,
            "expires_ms": None,
            "retry_due_ms": None,
            "heartbeat_due_ms": None,
            "retry_reason": None,
        },
    )
    recorded = RecordedResolution(fingerprint=f"redrive/{fact.redrive}", response=fact.response)
    kept_interactions = ChunkedMap.adopting(
        {k: i for k, i in state.interactions.items() if i.status != "open"}
    )
    return {
        "status": RUNNING,
        "phase": "idle",
        "execution": None,
        "recovery": None,
        "result": None,
        "error": None,
        "error_type": None,
        "failed_step": None,
        "failed_attempts": 0,
        "attempt": attempt,
        "completed_steps": tuple(s for s in state.completed_steps if s in kept),
        "nodes": {step: node for step, node in state.nodes.items() if step not in again},
        "lanes": {},
        "step_outputs": kept,
        "last_output": last_output,
        "unknown": None,
        "stop": Stop(),
        # The failed attempt's open interactions are abandoned: a late completion of one
        # is refused (unknown_interaction); a boundary reached again gets new ones.
        "interactions": kept_interactions,
        "boundary": state.boundary.counted(kept_interactions.values()),
        "redrives": {**state.redrives, fact.command_id: recorded},
    }


@_changes.register
def _(fact: RunQuarantined, state: RunState) -> RunChanges:
    # Only the mark: the run keeps its phase and wait, so a release resumes it as it was.
    quarantine = Quarantine.assemble(
        {
            "seq": fact.seq,
            "source": fact.source,
            "error_type": fact.error_type,
            "error": fact.error,
            "since_ms": fact.time_ms,
        },
    )
    return {"quarantine": quarantine}


@_changes.register
def _(fact: RunReleased, state: RunState) -> RunChanges:
    return {"quarantine": None}


# --- graph runs: where each step stands (``graph_run.py`` decides) ---------------------------


@_changes.register
def _(fact: NodeReady, state: RunState) -> RunChanges:
    lane = Lane.assemble({"last_output": fact.input})
    lanes = {**state.lanes, fact.segment: lane}
    if fact.item is not None:  # an item of a fan-out step starts in a lane of its own
        node = state.nodes[fact.step]
        started = node.evolve({"started_items": node.started_items + 1})
        return {"nodes": {**state.nodes, fact.step: started}, "lanes": lanes}
    node = NodeRun.assemble(
        {"status": "running", "segment": fact.segment, "items": fact.items or 0}
    )
    return {"nodes": {**state.nodes, fact.step: node}, "lanes": lanes}


@_changes.register
def _(fact: FanOutItemSettled, state: RunState) -> RunChanges:
    node = state.nodes[fact.step]
    changes: NodeRunChanges
    if fact.status == "succeeded":
        outputs = node.item_outputs.with_item(fact.item, fact.output)
        changes = {"succeeded_items": node.succeeded_items + 1, "item_outputs": outputs}
    else:
        failure = (fact.error_type or "Error", fact.error or "")
        errors = node.item_errors.with_item(fact.item, failure)
        changes = {"failed_items": node.failed_items + 1, "item_errors": errors}
    lanes = {segment: lane for segment, lane in state.lanes.items() if segment != fact.segment}
    return {"nodes": {**state.nodes, fact.step: node.evolve(changes)}, "lanes": lanes}


@_changes.register
def _(fact: NodeSkipped, state: RunState) -> RunChanges:
    node = NodeRun.assemble({"status": "skipped", "reason": fact.reason})
    lanes = state.lanes  # a step skipped by its predicate ran in a lane, which closes
    if segment_of(fact.step) in lanes:
        lanes = {s: lane for s, lane in lanes.items() if s != segment_of(fact.step)}
    return {"nodes": {**state.nodes, fact.step: node}, "lanes": lanes}


#: A settled step's status (a status this version does not know: failed).
_SETTLED: dict[str, NodeStatus] = {
    "succeeded": "succeeded",
    "failed": "failed",
    "stopped": "stopped",
}


@_changes.register
def _(fact: NodeSettled, state: RunState) -> RunChanges:
    node = state.nodes.get(fact.step, NodeRun()).evolve(
        {
            "status": _SETTLED.get(fact.status, "failed"),
            "error": fact.error,
            "error_type": fact.error_type,
            "attempts": fact.attempts,
            "item_outputs": ChunkedMap(),  # released in the step's output (StepCompleted)
            "item_errors": ChunkedMap(),
        }
    )
    # Its lane closes, and a fan-out step's item lanes with it.
    lanes = {
        segment: lane
        for segment, lane in state.lanes.items()
        if segment != fact.segment and not items_of_step(segment, fact.step)
    }
    return {"nodes": {**state.nodes, fact.step: node}, "lanes": lanes}


@_changes.register
def _(fact: RouteDecided, state: RunState) -> RunChanges:
    node = state.nodes.get(fact.step, NodeRun()).evolve({"routes": tuple(fact.routes)})
    return {"nodes": {**state.nodes, fact.step: node}}


@_changes.register
def _(fact: CatchDecided, state: RunState) -> RunChanges:
    node = state.nodes.get(fact.step, NodeRun()).evolve({"status": "caught"})
    return {"nodes": {**state.nodes, fact.step: node}}


@_changes.register
def _(fact: GraphSettled, state: RunState) -> RunChanges:
    step = fact.result_step
    output = b"null" if step is None else state.step_outputs.get(step, b"null")
    failed = sorted(step for step, node in state.nodes.items() if node.status == "failed")
    if fact.outcome != "failed" or not failed:
        return {"last_output": output}
    # The run's failure is its first failed step's (not the last attempt's to fail).
    node = state.nodes[failed[0]]
    return {
        "last_output": output,
        "error": node.error,
        "error_type": node.error_type,
        "failed_step": failed[0],
    }
