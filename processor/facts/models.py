"""Pydantic models mirroring the Avro schemas in ``schemas/`` field for field.

Facts are past tense, commands imperative, messages nouns. Every fact carries
the run id, its per-run sequence number, its fact key, the decision time and the
id of the input that caused it (``FactHeader``). Tests check each model against
its ``.avsc`` file, so the two cannot drift apart.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

__all__ = [
    "FACT_TYPES",
    "MESSAGE_TYPES",
    "AttemptHeartbeatRecorded",
    "AttemptLost",
    "AttemptOutcomeUnknown",
    "AttemptProgress",
    "AttemptResolved",
    "AttemptStepStarted",
    "AvroModel",
    "BoundaryCompletion",
    "BoundaryCompletionAdmitted",
    "BoundaryDispatchCompleted",
    "BoundaryInteractionDispatched",
    "BoundaryInteractionQueued",
    "BoundaryRequest",
    "CancelRun",
    "CatchDecided",
    "CheckpointHandoff",
    "ChildRunLinked",
    "ClaimReply",
    "CommandReply",
    "CompensationAttemptFailed",
    "CompensationAttemptStarted",
    "CompensationStarted",
    "CompensationStepCompleted",
    "CompensationStepSkipped",
    "ContinuationSegmentCreated",
    "DeadLetter",
    "Emission",
    "EventEmitted",
    "FactBatch",
    "FactHeader",
    "FanOutItemSettled",
    "GraphSettled",
    "InteractionTimedOut",
    "LoadedPipeline",
    "NodeReady",
    "NodeSettled",
    "NodeSkipped",
    "RedriveRun",
    "Rejected",
    "ReleaseRun",
    "ResolveAttempt",
    "RetryScheduled",
    "RouteDecided",
    "RunDefinitionBlocked",
    "RunFailed",
    "RunOutcome",
    "RunQuarantined",
    "RunRedriven",
    "RunReleased",
    "RunStopRequested",
    "RunStopped",
    "RunSubmitted",
    "RunSucceeded",
    "ScheduleCommand",
    "ScheduleRecorded",
    "ScheduledRunLinked",
    "SegmentAttemptStarted",
    "SegmentCompleted",
    "SegmentFailed",
    "SegmentResult",
    "SegmentSuspended",
    "SignalEvent",
    "SleepCompleted",
    "SleepStarted",
    "StepCompleted",
    "StepOutput",
    "StopNotice",
    "SubmitRun",
    "TerminalPublicationCompleted",
    "TerminalPublicationPrepared",
    "WorkItem",
    "WorkerAnnouncement",
]


class AvroModel(BaseModel):
    """A record with an Avro schema of the same name in ``schemas/``."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class FactHeader(AvroModel):
    """Fields every fact carries."""

    run_id: str
    seq: int
    fact_key: str
    time_ms: int
    cause_id: str


class RunSubmitted(FactHeader):
    pipeline: str
    pipeline_version: int
    input: bytes
    idempotency_key: str | None = None
    fingerprint: str | None = None
    submitted_ms: int
    deadline_ms: int | None = None
    traceparent: str | None = None


class SegmentAttemptStarted(FactHeader):
    segment: int
    attempt: int
    generation: int
    first_step: int
    # The schedule-to-start expiry; None: no timer until a worker reports the start.
    expires_ms: int | None = None


class AttemptStepStarted(FactHeader):
    """A worker started a step of the current attempt, forward or compensator: its timer
    runs from now. Of a compensator (``kind`` compensate), ``segment`` and ``step`` are
    the compensated step, as in ``AttemptOutcomeUnknown``."""

    segment: int
    attempt: int
    generation: int
    step: int
    worker_id: str
    expires_ms: int
    heartbeat_due_ms: int | None = None
    redelivered: bool = False  # started again by another worker: an infrastructure loss
    kind: str = "forward"  # forward | compensate


class AttemptHeartbeatRecorded(FactHeader):
    """A heartbeat of the running step (or compensator) moved its heartbeat timer."""

    segment: int
    attempt: int
    generation: int
    step: int
    heartbeat_due_ms: int
    kind: str = "forward"  # forward | compensate


class AttemptLost(FactHeader):
    """The attempt was lost to the infrastructure: not charged to the retry budget."""

    segment: int
    attempt: int
    generation: int
    step: int
    cause: str  # schedule_to_start_timeout | heartbeat_timeout (forward only)
    losses: int  # the run's infrastructure losses, this one included
    kind: str = "forward"  # forward | compensate


class RunDefinitionBlocked(FactHeader):
    """The run's next forward attempt waits for a worker that loads its pinned version.

    ``attempt``/``generation``/``first_step`` name the attempt that starts once such a
    worker announces itself; ``step_attempts`` is the retry budget used without it
    (an attempt a worker refused with ``UnknownPipeline`` is not charged)."""

    segment: int
    attempt: int
    generation: int
    first_step: int
    step_attempts: int
    reason: str  # no_live_worker | worker_lacks_version
    worker_id: str | None = None  # the worker that answered UnknownPipeline
    detail: str = ""


class StepCompleted(FactHeader):
    segment: int
    attempt: int
    generation: int
    step: int
    output: bytes


class SegmentCompleted(FactHeader):
    segment: int
    attempt: int
    generation: int
    last_step: int


class SegmentFailed(FactHeader):
    segment: int
    attempt: int
    generation: int
    step: int
    error: str
    error_type: str
    retryable: bool
    reason: str | None = None  # the retry decision (README: retry reasons)


class RetryScheduled(FactHeader):
    segment: int
    attempt: int
    due_ms: int
    reason: str | None = None  # eligible


class SegmentSuspended(FactHeader):
    segment: int
    attempt: int
    generation: int
    step: int
    boundary: int
    kind: str
    target: str
    itemized: bool
    items: int
    on_timeout: str


class BoundaryInteractionDispatched(FactHeader):
    boundary: int
    interaction: str
    item_index: int
    target: str
    request: bytes
    deadline_ms: int
    token_digest: bytes
    epoch: int


class BoundaryInteractionQueued(FactHeader):
    """An item of an itemized await under a limit, held until there is room for it."""

    boundary: int
    interaction: str
    item_index: int
    target: str
    request: bytes


class BoundaryDispatchCompleted(FactHeader):
    boundary: int
    interactions: int


class BoundaryCompletionAdmitted(FactHeader):
    boundary: int
    interaction: str
    item_index: int
    source: str
    outcome: str
    payload: bytes
    content_type: str
    error: str | None = None
    idempotency_key: str | None = None
    payload_digest: bytes


class InteractionTimedOut(FactHeader):
    boundary: int
    interaction: str
    item_index: int
    deadline_ms: int


class ContinuationSegmentCreated(FactHeader):
    boundary: int
    segment: int
    first_step: int
    input: bytes


class TerminalPublicationPrepared(FactHeader):
    topic: str
    idempotency_key: str


class TerminalPublicationCompleted(FactHeader):
    topic: str
    idempotency_key: str


class RunSucceeded(FactHeader):
    result: bytes


class RunFailed(FactHeader):
    error: str
    error_type: str
    step: int
    attempts: int
    recovery: str = "NotRequired"
    reason: str | None = None  # why no further attempt was made (README: retry reasons)


class RunStopRequested(FactHeader):
    reason: str
    detail: str


class AttemptOutcomeUnknown(FactHeader):
    kind: str
    segment: int
    attempt: int
    generation: int
    step: int


class AttemptResolved(FactHeader):
    kind: str
    segment: int
    attempt: int
    generation: int
    action: str
    idempotency_key: str
    fingerprint: str
    output: bytes | None = None
    error: str | None = None
    response: str


class CompensationStarted(FactHeader):
    steps: tuple[int, ...]


class CompensationAttemptStarted(FactHeader):
    step: int
    attempt: int
    generation: int
    # The schedule-to-start expiry; None: no timer until a worker reports the start.
    expires_ms: int | None = None


class CompensationStepCompleted(FactHeader):
    step: int
    attempt: int
    generation: int


class CompensationStepSkipped(FactHeader):
    step: int
    reason: str


class CompensationAttemptFailed(FactHeader):
    step: int
    attempt: int
    generation: int
    error: str
    error_type: str
    retry_due_ms: int | None = None
    reason: str | None = None  # the compensator's retry decision


class SleepStarted(FactHeader):
    """The run sleeps at a sleep step until ``wake_ms``, fixed here once."""

    segment: int
    attempt: int
    generation: int
    step: int
    wake_ms: int


class SleepCompleted(FactHeader):
    """The sleep's timer fired: the sleep step completes with its input."""

    segment: int
    step: int
    wake_ms: int


class RunStopped(FactHeader):
    execution: str
    recovery: str
    detail: str


class RunRedriven(FactHeader):
    redrive: int
    command_id: str
    operator: str
    reason: str
    from_step: int
    failed_step: int
    previous_execution: str
    previous_recovery: str
    previous_error: str | None = None
    previous_error_type: str | None = None
    previous_segment: int
    previous_attempt: int
    previous_generation: int
    previous_attempts: int
    response: str
    steps: tuple[int, ...] = ()


class RunQuarantined(FactHeader):
    """A decision about the run raised: it waits for an operator (``model/quarantine.py``)."""

    source: str  # timer:<kind>, wake, or the input's topic
    error_type: str
    error: str  # capped


class RunReleased(FactHeader):
    """An operator released a quarantined run: its timers and inputs are decided again."""

    command_id: str
    operator: str
    reason: str
    quarantined_seq: int


class NodeReady(FactHeader):
    """A graph step runs, in its own lane (``segment``), on ``input``; or one ``item`` of
    a fan-out step (of ``items``) starts in its lane."""

    step: int
    segment: int
    input: bytes
    items: int | None = None
    item: int | None = None


class ChildRunLinked(FactHeader):
    """This run is a child run (``processor.model.children``): its outcome completes
    its parent's interaction."""

    parent_run_id: str
    parent_token: str
    depth: int


class ScheduledRunLinked(FactHeader):
    """This run was started by a schedule's fire (``processor.model.schedules``)."""

    schedule_id: str
    fire_ms: int


class EventEmitted(FactHeader):
    """A step emitted an event (``processor.model.emission``): published with this fact."""

    segment: int
    step: int
    index: int
    event_id: str
    topic: str
    key: str
    value: bytes


class FanOutItemSettled(FactHeader):
    """One item of a fan-out step settled: its output, or its error after its retries."""

    step: int
    item: int
    segment: int
    status: str
    output: bytes
    error: str | None = None
    error_type: str | None = None


class NodeSkipped(FactHeader):
    """A graph step will not run: ``readiness_unsatisfied`` or ``predicate_false``."""

    step: int
    reason: str


class NodeSettled(FactHeader):
    """A graph step's lane ended: ``succeeded``, or ``failed`` after its retries."""

    step: int
    segment: int
    status: str
    error: str | None = None
    error_type: str | None = None
    attempts: int


class RouteDecided(FactHeader):
    """A switch step's chosen routes (step names); the others are skipped."""

    step: int
    routes: tuple[str, ...]


class CatchDecided(FactHeader):
    """A failed graph step is handled: ``handler`` runs, its output stands in."""

    step: int
    handler: int


class GraphSettled(FactHeader):
    """Every step of a graph run settled: the outcome and the result's step."""

    outcome: str
    result_step: int | None = None


FACT_TYPES: tuple[type[FactHeader], ...] = (
    RunSubmitted,
    SegmentAttemptStarted,
    StepCompleted,
    SegmentCompleted,
    SegmentFailed,
    RetryScheduled,
    SegmentSuspended,
    BoundaryInteractionDispatched,
    BoundaryDispatchCompleted,
    BoundaryCompletionAdmitted,
    InteractionTimedOut,
    ContinuationSegmentCreated,
    TerminalPublicationPrepared,
    TerminalPublicationCompleted,
    RunSucceeded,
    RunFailed,
    RunStopRequested,
    AttemptOutcomeUnknown,
    AttemptResolved,
    CompensationStarted,
    CompensationAttemptStarted,
    CompensationStepCompleted,
    CompensationStepSkipped,
    CompensationAttemptFailed,
    RunStopped,
    RunRedriven,
    AttemptStepStarted,
    AttemptHeartbeatRecorded,
    AttemptLost,
    SleepStarted,
    SleepCompleted,
    RunDefinitionBlocked,
    RunQuarantined,
    RunReleased,
    NodeReady,
    NodeSkipped,
    NodeSettled,
    RouteDecided,
    CatchDecided,
    GraphSettled,
    FanOutItemSettled,
    BoundaryInteractionQueued,
    EventEmitted,
    ChildRunLinked,
    ScheduledRunLinked,
)


class SubmitRun(AvroModel):
    command_id: str
    run_id: str
    pipeline: str
    input: bytes
    idempotency_key: str | None = None
    submitted_ms: int
    deadline_ms: int | None = None
    deadline_after_ms: int | None = None
    traceparent: str | None = None
    parent_run_id: str | None = None
    parent_token: str | None = None
    depth: int = 0
    schedule_id: str | None = None
    fire_ms: int | None = None


class CancelRun(AvroModel):
    command_id: str
    run_id: str
    reason: str = ""
    requested_ms: int


class ResolveAttempt(AvroModel):
    command_id: str
    run_id: str
    kind: str = "forward"
    segment: int
    attempt: int
    generation: int
    idempotency_key: str
    action: str
    output: bytes | None = None
    error: str | None = None


class RedriveRun(AvroModel):
    command_id: str
    run_id: str
    from_step: int | None = None
    operator: str = ""
    reason: str = ""
    requested_ms: int


class WorkItem(AvroModel):
    run_id: str
    pipeline: str
    pipeline_version: int
    segment: int
    attempt: int
    generation: int
    first_step: int
    input: bytes
    expires_ms: int
    kind: str = "forward"
    run_deadline_ms: int | None = None


class StepOutput(AvroModel):
    step: int
    output: bytes


class Emission(AvroModel):
    """An event a step emitted (``ctx.emit``), carried by its attempt's result."""

    step: int
    topic: str
    key: str | None = None
    value: bytes


class SegmentResult(AvroModel):
    result_id: str
    run_id: str
    segment: int
    attempt: int
    generation: int
    steps: tuple[StepOutput, ...]
    outcome: Literal["completed", "failed", "suspended", "skipped"]
    failed_step: int | None = None
    error: str | None = None
    error_type: str | None = None
    retryable: bool = True
    worker_id: str
    requests: tuple[bytes, ...] = ()
    kind: str = "forward"
    emits: tuple[Emission, ...] = ()


class AttemptProgress(AvroModel):
    """A worker's report on an attempt it runs: the step started, or it heartbeats; or its
    claim of an attempt it is about to run (``claim``: answered by a ``ClaimReply``)."""

    run_id: str
    kind: str = "forward"
    segment: int
    attempt: int
    generation: int
    step: int
    report: Literal["started", "heartbeat"]
    worker_id: str
    at_ms: int
    details: bytes | None = None
    claim: bool = False


class LoadedPipeline(AvroModel):
    name: str
    version: int


class WorkerAnnouncement(AvroModel):
    """A live worker and the pipeline versions it can run (sent to every results partition)."""

    worker_id: str
    group: str
    pipelines: tuple[LoadedPipeline, ...]
    concurrency: int
    at_ms: int
    leaving: bool = False


class StopNotice(AvroModel):
    """Stop was requested for a run whose attempt may be running (on segments.work)."""

    run_id: str
    kind: str = "forward"
    segment: int
    attempt: int
    generation: int
    reason: str
    at_ms: int


class FactBatch(AvroModel):
    """Facts of one run committed together, as one record of runs.facts
    (``facts/fact_batch.py``): each a whole single-object value, in order."""

    facts: list[bytes]


class ClaimReply(AvroModel):
    """The processor's answer to a worker's claim of an attempt (on segments.control)."""

    run_id: str
    kind: str = "forward"
    segment: int
    attempt: int
    generation: int
    worker_id: str  # the claimant
    granted: bool
    reason: str | None = None  # why not (``model.claims``)
    detail: str | None = None
    at_ms: int


class CommandReply(AvroModel):
    command_id: str
    run_id: str
    created: bool
    refusal: str | None = None
    detail: str | None = None
    response: str | None = None


class RunOutcome(AvroModel):
    run_id: str
    pipeline: str
    status: str
    result: bytes | None = None
    error: str | None = None
    submitted_ms: int
    finished_ms: int


class DeadLetter(AvroModel):
    run_id: str
    pipeline: str
    pipeline_version: int
    input: bytes
    step: int
    attempts: int
    error: str
    error_type: str
    failed_ms: int


class Rejected(AvroModel):
    reason: str
    detail: str
    source_topic: str
    source_partition: int
    source_offset: int
    original_key: bytes | None = None
    original_value: bytes | None = None
    run_id: str | None = None
    rejected_ms: int


class BoundaryRequest(AvroModel):
    run_id: str
    boundary: int
    interaction: str
    item_index: int
    target: str
    request: bytes
    deadline_ms: int
    resume_token: str
    # Set on a cancel notice: the run was stopped (cancelled, timed_out or failed); the
    # request and resume token are empty, and a completion would be refused.
    cancel: str | None = None


class BoundaryCompletion(AvroModel):
    token: str
    idempotency_key: str
    outcome: Literal["success", "failure"]
    payload: bytes = b""
    error: str | None = None
    content_type: str = "application/json"


class CheckpointHandoff(AvroModel):
    source_run_id: str
    checkpoint: str
    target: str
    idempotency_key: str
    payload: bytes
    content_type: str = "application/json"
    signature: str | None = None  # see processor/facts/handoff_signature.py


class SignalEvent(AvroModel):
    """A named event for waiting runs (``docs/design/signals.md``)."""

    event_id: str
    name: str
    run_id: str | None = None
    correlation_key: str | None = None
    correlation: dict[str, str] = {}
    payload: bytes
    content_type: str = "application/json"
    interaction: str | None = None
    fanned_out: bool = False
    sent_ms: int = 0
    visited: tuple[int, ...] = ()
    matched: int = 0


class ReleaseRun(AvroModel):
    command_id: str
    run_id: str
    operator: str = ""
    reason: str = ""
    requested_ms: int


# Schedules (processor/model/schedules.py): on runs.schedules, keyed by schedule id.


# Schedules (processor/model/schedules.py): on runs.schedules, keyed by schedule id.


class ScheduleCommand(AvroModel):
    """Create, pause, resume or delete a schedule (``action``); the spec on create."""

    command_id: str
    schedule_id: str
    action: str
    requested_ms: int
    pipeline: str | None = None
    input: bytes | None = None
    cron: str | None = None
    interval_ms: int | None = None
    timezone: str | None = None
    start_ms: int | None = None
    catch_up: str | None = None
    catch_up_limit: int | None = None
    overlap: str | None = None
    jitter_ms: int | None = None


class ScheduleRecorded(AvroModel):
    """Something that happened to a schedule: ``kind`` is created, paused, resumed,
    deleted, fired (a run submitted), skipped (``count`` fire times, ``reason``) or
    queued; ``fire_ms`` the fire time (or the resume time). A fact of the schedule's
    own partition of runs.schedules, not of a run: listed with the messages."""

    schedule_id: str
    fact_key: str
    kind: str
    time_ms: int
    cause_id: str
    fire_ms: int | None = None
    run_id: str | None = None
    reason: str | None = None
    count: int | None = None
    pipeline: str | None = None
    input: bytes | None = None
    cron: str | None = None
    interval_ms: int | None = None
    timezone: str | None = None
    start_ms: int | None = None
    catch_up: str | None = None
    catch_up_limit: int | None = None
    overlap: str | None = None
    jitter_ms: int | None = None


MESSAGE_TYPES: tuple[type[AvroModel], ...] = (
    SubmitRun,
    WorkItem,
    SegmentResult,
    CommandReply,
    RunOutcome,
    DeadLetter,
    Rejected,
    BoundaryRequest,
    BoundaryCompletion,
    CheckpointHandoff,
    CancelRun,
    ResolveAttempt,
    RedriveRun,
    ReleaseRun,
    AttemptProgress,
    WorkerAnnouncement,
    StopNotice,
    ClaimReply,
    ScheduleCommand,
    ScheduleRecorded,
    SignalEvent,
    FactBatch,
)
