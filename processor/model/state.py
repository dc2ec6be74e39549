"""The run projection: everything decide needs to know about one run.

Each model names its changes, a TypedDict of exactly its fields and their types, as
``Evolvable[...]``: a reducer returns ``RunChanges`` and builds a part with the part's
own ``evolve`` and ``assemble``, so mypy refuses a field the model does not declare
(``tests/unit/test_changes.py`` keeps each TypedDict equal to its model).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal, TypedDict

from pydantic import BaseModel, ConfigDict

from processor.facts.trusted import Evolvable
from processor.model.chunked_map import ChunkedMap
from processor.model.parent_link import ParentLink
from processor.model.schedule_link import ScheduleLink

__all__ = [
    "COMPENSATE",
    "FAILED",
    "FORWARD",
    "LANE_FIELDS",
    "RUNNING",
    "RUNNING_PHASES",
    "SUCCEEDED",
    "TERMINAL",
    "Attempt",
    "AttemptKind",
    "Boundary",
    "BoundaryChanges",
    "Compensation",
    "CompensationChanges",
    "ForwardAttempt",
    "ForwardAttemptChanges",
    "Interaction",
    "InteractionChanges",
    "Lane",
    "LaneChanges",
    "NodeRun",
    "NodeRunChanges",
    "NodeStatus",
    "Phase",
    "Publication",
    "PublicationChanges",
    "Quarantine",
    "QuarantineChanges",
    "RecordedResolution",
    "RecordedResolutionChanges",
    "RunChanges",
    "RunState",
    "RunStatus",
    "Sleep",
    "SleepChanges",
    "Stop",
    "StopChanges",
    "UnknownAttempt",
    "UnknownAttemptChanges",
]

RunStatus = Literal["running", "succeeded", "failed", "cancelled", "timed_out"]
RUNNING: RunStatus = "running"
SUCCEEDED: RunStatus = "succeeded"
FAILED: RunStatus = "failed"
TERMINAL: frozenset[str] = frozenset({SUCCEEDED, FAILED, "cancelled", "timed_out"})

# What the run waits for: a worker result, a retry timer, a worker that loads its
# pinned pipeline version, outside input at a boundary, its sleep's timer, the
# terminal publication, an operator (unknown outcome), a compensator (or its retry
# timer), or nothing.
Phase = Literal[
    "dispatched",
    "definition_blocked",
    "retry_wait",
    "suspended",
    "sleeping",
    "publishing",
    "unknown",
    "compensating",
    "compensation_retry_wait",
    "idle",
]
InteractionStatus = Literal["queued", "open", "admitted", "timed_out"]

#: The two kinds of attempt a run makes: forward segments, and compensators of the unwind.
AttemptKind = Literal["forward", "compensate"]
FORWARD: AttemptKind = "forward"
COMPENSATE: AttemptKind = "compensate"
#: The phase in which an attempt of each kind runs on a worker.
RUNNING_PHASES: dict[str, AttemptKind] = {"dispatched": FORWARD, "compensating": COMPENSATE}


@dataclass(frozen=True, slots=True)
class Attempt:
    """The current attempt of one kind, whatever its kind: ``RunState.attempt_of``.

    ``scope`` is what the attempt runs: the segment of a forward attempt, the
    compensated step of a compensator. While it runs, ``expires_ms`` is its
    schedule-to-start expiry until a worker reports a step started
    (``started_step``), then its start-to-close one.
    """

    kind: AttemptKind
    scope: int
    number: int
    generation: int
    expires_ms: int | None  # while it runs
    retry_due_ms: int | None  # while it waits to be tried again
    running: bool  # dispatched to a worker, its result awaited
    waiting: bool  # failed, its next try after backoff
    started_step: int | None = None  # the step a worker last reported started
    worker_id: str | None = None  # the worker that reported it
    heartbeat_due_ms: int | None = None  # lost without a heartbeat by then


_CONFIG = ConfigDict(frozen=True, extra="forbid", ser_json_bytes="base64", val_json_bytes="base64")


class InteractionChanges(TypedDict, total=False):
    """A change to ``Interaction``: any of its fields, with their types."""

    boundary: int
    item_index: int
    kind: str
    target: str
    deadline_ms: int
    token_digest: bytes
    status: InteractionStatus
    outcome: str | None
    digest: bytes | None
    output: bytes | None
    error: str | None
    request: bytes | None


class Interaction(BaseModel, Evolvable[InteractionChanges]):
    """One interaction of a boundary; kept after release so duplicates stay no-ops."""

    model_config = _CONFIG

    boundary: int
    item_index: int
    kind: str
    target: str
    deadline_ms: int  # 0: no deadline (the start boundary of a run begun from a checkpoint)
    token_digest: bytes
    status: InteractionStatus = "open"
    outcome: str | None = None
    digest: bytes | None = None
    output: bytes | None = None  # dropped once the boundary released
    error: str | None = None
    request: bytes | None = None  # while queued: sent once there is room in flight

    def failed(self, on_timeout: str) -> bool:
        """Whether it settled as a failure: the external system reported one, or it timed
        out at a boundary whose ``on_timeout`` is ``fail``."""
        if self.status == "admitted":
            return self.outcome == "failure"
        return self.status == "timed_out" and on_timeout == "fail"


#: An interaction's statuses once it settled (queued and open ones have not).
_SETTLED = frozenset({"admitted", "timed_out"})


class UnknownAttemptChanges(TypedDict, total=False):
    """A change to ``UnknownAttempt``: any of its fields, with their types."""

    kind: str
    segment: int
    attempt: int
    generation: int
    step: int


class UnknownAttempt(BaseModel, Evolvable[UnknownAttemptChanges]):
    """The attempt an operator must resolve: no automatic retry."""

    model_config = _CONFIG

    kind: str
    segment: int
    attempt: int
    generation: int
    step: int


class RecordedResolutionChanges(TypedDict, total=False):
    """A change to ``RecordedResolution``: any of its fields, with their types."""

    fingerprint: str
    response: str


class RecordedResolution(BaseModel, Evolvable[RecordedResolutionChanges]):
    """An operator command already applied (a resolution, a redrive): a repeat returns
    the same response."""

    model_config = _CONFIG

    fingerprint: str
    response: str


class ForwardAttemptChanges(TypedDict, total=False):
    """A change to ``ForwardAttempt``: any of its fields, with their types."""

    segment: int
    number: int
    generation: int
    next_step: int
    step_attempts: int
    expires_ms: int | None
    retry_due_ms: int | None
    started_step: int | None
    worker_id: str | None
    heartbeat_due_ms: int | None
    retry_reason: str | None


class ForwardAttempt(BaseModel, Evolvable[ForwardAttemptChanges]):
    """Where the run's forward execution is: its segment, attempt and next step."""

    model_config = _CONFIG

    segment: int = 0
    number: int = 0  # the attempt's number within the segment
    generation: int = 0
    next_step: int = 0
    step_attempts: int = 0  # attempts that have tried ``next_step``: the retry budget used
    # While dispatched: the schedule-to-start expiry until a worker reports the start,
    # then the start-to-close one (from the start report); None: no such timer.
    expires_ms: int | None = None
    retry_due_ms: int | None = None  # while waiting to retry
    started_step: int | None = None  # the step a worker last reported started
    worker_id: str | None = None  # the worker that reported it
    heartbeat_due_ms: int | None = None  # lost without a heartbeat by then
    # The last retry decision of the run's forward attempts (README: retry reasons).
    retry_reason: str | None = None


class SleepChanges(TypedDict, total=False):
    """A change to ``Sleep``: any of its fields, with their types."""

    step: int | None
    wake_ms: int | None


class Sleep(BaseModel, Evolvable[SleepChanges]):
    """The sleep the run is in (phase ``sleeping``): its step and its fixed wake time."""

    model_config = _CONFIG

    step: int | None = None
    wake_ms: int | None = None


class BoundaryChanges(TypedDict, total=False):
    """A change to ``Boundary``: any of its fields, with their types."""

    number: int
    step: int | None
    kind: str
    itemized: bool
    items: int
    on_timeout: str
    dispatched: bool
    total: int
    settled: int
    failed: int


class Boundary(BaseModel, Evolvable[BoundaryChanges]):
    """The boundary the run last suspended at (its interactions are ``RunState.interactions``)."""

    model_config = _CONFIG

    number: int = 0
    step: int | None = None  # the await step
    kind: str = "await"
    itemized: bool = False
    items: int = 0
    on_timeout: str = "fail"
    dispatched: bool = False  # every interaction sent
    # Its interactions in ``RunState.interactions``, counted by the fold as they come and
    # settle, so that an admission to a boundary of many items need not read them all.
    # 0 in a row stored before the counts were kept: they are then read (``counted``).
    total: int = 0
    settled: int = 0  # admitted or timed out
    failed: int = 0  # of those, the failures (``Interaction.failed``)

    def counted(self, interactions: Iterable[Interaction]) -> Boundary:
        """This boundary with its counts read from ``interactions`` (all of the run's)."""
        total = settled = failed = 0
        for interaction in interactions:
            t, s, f = self._tally(interaction)
            total, settled, failed = total + t, settled + s, failed + f
        return self.evolve({"total": total, "settled": settled, "failed": failed})

    def recounted(self, before: Interaction | None, after: Interaction) -> Boundary:
        """This boundary's counts once ``after`` replaced ``before`` (None: added)."""
        t0, s0, f0 = (0, 0, 0) if before is None else self._tally(before)
        t1, s1, f1 = self._tally(after)
        if (t0, s0, f0) == (t1, s1, f1):
            return self
        changes: BoundaryChanges = {
            "total": self.total + t1 - t0,
            "settled": self.settled + s1 - s0,
            "failed": self.failed + f1 - f0,
        }
        return self.evolve(changes)

    def _tally(self, interaction: Interaction) -> tuple[int, int, int]:
        """What ``interaction`` adds to the counts: (total, settled, failed), nothing
        unless it is this boundary's (``native/src/state.rs`` ``tally``)."""
        if interaction.boundary != self.number:
            return (0, 0, 0)
        failed = interaction.failed(self.on_timeout)
        return (1, int(interaction.status in _SETTLED), int(failed))


class PublicationChanges(TypedDict, total=False):
    """A change to ``Publication``: any of its fields, with their types."""

    targets: dict[str, str]
    key: str | None
    due_ms: int | None


class Publication(BaseModel, Evolvable[PublicationChanges]):
    """The terminal publication: each target topic's progress, its key and its timer."""

    model_config = _CONFIG

    targets: dict[str, str] = {}  # topic -> "prepared" | "completed"
    key: str | None = None
    due_ms: int | None = None


class StopChanges(TypedDict, total=False):
    """A change to ``Stop``: any of its fields, with their types."""

    reason: str | None
    detail: str | None


class Stop(BaseModel, Evolvable[StopChanges]):
    """Stop intent: the first committed reason decides."""

    model_config = _CONFIG

    reason: str | None = None  # cancelled | timed_out | failed
    detail: str | None = None


class CompensationChanges(TypedDict, total=False):
    """A change to ``Compensation``: any of its fields, with their types."""

    started: bool
    unwind: tuple[int, ...]
    step: int | None
    attempt: int
    generation: int
    expires_ms: int | None
    retry_due_ms: int | None
    retry_reason: str | None
    compensated: int
    skipped: int
    failed: bool
    worker_id: str | None
    heartbeat_due_ms: int | None


class Compensation(BaseModel, Evolvable[CompensationChanges]):
    """The unwind: the steps still to compensate, the compensator attempt, the tally."""

    model_config = _CONFIG

    started: bool = False
    unwind: tuple[int, ...] = ()  # steps still to compensate, next first
    step: int | None = None  # the step being compensated
    attempt: int = 0
    generation: int = 0
    # While compensating, as a forward attempt's: the schedule-to-start expiry until a
    # worker reports the compensator started, then the compensation timeout's.
    expires_ms: int | None = None
    retry_due_ms: int | None = None
    retry_reason: str | None = None  # the compensator's last retry decision
    compensated: int = 0
    skipped: int = 0
    failed: bool = False
    worker_id: str | None = None  # the worker that reported the compensator started
    heartbeat_due_ms: int | None = None  # lost without a heartbeat by then


class QuarantineChanges(TypedDict, total=False):
    """A change to ``Quarantine``: any of its fields, with their types."""

    seq: int
    source: str
    error_type: str
    error: str
    since_ms: int


class Quarantine(BaseModel, Evolvable[QuarantineChanges]):
    """What a run is quarantined for: a decision about it raised (``model/quarantine.py``)."""

    model_config = _CONFIG

    seq: int  # of its RunQuarantined fact
    source: str  # timer:<kind>, wake, or the input's topic
    error_type: str
    error: str
    since_ms: int


class LaneChanges(TypedDict, total=False):
    """A change to ``Lane``: any of its fields, with their types."""

    phase: Phase
    attempt: ForwardAttempt
    boundary: Boundary
    sleep: Sleep
    unknown: UnknownAttempt | None
    last_output: bytes


class Lane(BaseModel, Evolvable[LaneChanges]):
    """One live segment of a graph run: a step in flight, with its own wait and attempt.

    Its fields are ``RunState``'s of the same names: a chain keeps them flat, a graph
    run keeps one ``Lane`` per running step (``RunState.lane_view``).
    ``last_output`` is the step's input (what an attempt of it is given).
    """

    model_config = _CONFIG

    phase: Phase = "idle"
    attempt: ForwardAttempt = ForwardAttempt()
    boundary: Boundary = Boundary()
    sleep: Sleep = Sleep()
    unknown: UnknownAttempt | None = None
    last_output: bytes = b"null"


#: The fields of ``RunState`` that are a lane's in a graph run.
LANE_FIELDS: tuple[str, ...] = tuple(Lane.model_fields)

NodeStatus = Literal["running", "succeeded", "failed", "caught", "skipped", "stopped"]


class NodeRunChanges(TypedDict, total=False):
    """A change to ``NodeRun``: any of its fields, with their types."""

    status: NodeStatus
    segment: int
    reason: str | None
    routes: tuple[str, ...] | None
    error: str | None
    error_type: str | None
    attempts: int
    items: int
    started_items: int
    succeeded_items: int
    failed_items: int
    item_outputs: ChunkedMap[int, bytes]
    item_errors: ChunkedMap[int, tuple[str, str]]


class NodeRun(BaseModel, Evolvable[NodeRunChanges]):
    """Where one step of a graph run stands (a step without one is pending)."""

    model_config = _CONFIG

    status: NodeStatus = "running"
    segment: int = 0  # its lane, once it ran
    reason: str | None = None  # why it was skipped
    routes: tuple[str, ...] | None = None  # a switch's chosen routes
    error: str | None = None  # a failed step's error, what its catch handler receives
    error_type: str | None = None
    attempts: int = 0
    # A fan-out step's items: how many, started (the lowest indexes), settled, and the
    # settled ones' outputs and (type, message) errors until the step's output is released.
    items: int = 0
    started_items: int = 0
    succeeded_items: int = 0
    failed_items: int = 0
    item_outputs: ChunkedMap[int, bytes] = ChunkedMap()
    item_errors: ChunkedMap[int, tuple[str, str]] = ChunkedMap()


class RunChanges(TypedDict, total=False):
    """A change to ``RunState``, what a reducer returns: any of its fields, with their types."""

    run_id: str
    pipeline: str
    pipeline_version: int
    status: RunStatus
    version: int
    input: bytes
    submitted_ms: int
    created_ms: int
    updated_ms: int
    idempotency_key: str | None
    fingerprint: str | None
    submit_command_id: str
    last_output: bytes
    phase: Phase
    attempt: ForwardAttempt
    completed_steps: tuple[int, ...]
    step_outputs: dict[int, bytes]
    boundary: Boundary
    sleep: Sleep
    interactions: ChunkedMap[str, Interaction]
    publication: Publication
    result: bytes | None
    error: str | None
    error_type: str | None
    failed_step: int | None
    failed_attempts: int
    deadline_ms: int | None
    stop: Stop
    unknown: UnknownAttempt | None
    resolutions: dict[str, RecordedResolution]
    compensation: Compensation
    execution: str | None
    recovery: str | None
    redrives: dict[str, RecordedResolution]
    traceparent: str | None
    infrastructure_losses: int
    quarantine: Quarantine | None
    lanes: dict[int, Lane]
    nodes: dict[int, NodeRun]
    parent: ParentLink | None
    schedule: ScheduleLink | None


class RunState(BaseModel, Evolvable[RunChanges]):
    """Projection of one run, folded from its facts by ``reduce``.

    Stored flat (``processor/store/run_row.py``), the row the compiled fold writes too.
    """

    model_config = _CONFIG

    run_id: str
    pipeline: str
    pipeline_version: int
    status: RunStatus = RUNNING
    version: int = 0
    input: bytes
    submitted_ms: int
    created_ms: int
    updated_ms: int
    idempotency_key: str | None = None
    fingerprint: str | None = None
    submit_command_id: str
    last_output: bytes
    phase: Phase = "idle"
    attempt: ForwardAttempt = ForwardAttempt()
    completed_steps: tuple[int, ...] = ()
    step_outputs: dict[int, bytes] = {}
    boundary: Boundary = Boundary()
    sleep: Sleep = Sleep()
    interactions: ChunkedMap[str, Interaction] = ChunkedMap()
    publication: Publication = Publication()
    result: bytes | None = None
    error: str | None = None
    error_type: str | None = None
    failed_step: int | None = None
    failed_attempts: int = 0
    deadline_ms: int | None = None
    stop: Stop = Stop()
    unknown: UnknownAttempt | None = None
    resolutions: dict[str, RecordedResolution] = {}
    compensation: Compensation = Compensation()
    execution: str | None = None  # Completed | Failed | Cancelled | TimedOut, once terminal
    recovery: str | None = None  # NotRequired | Compensated | PartiallyCompensated | ...
    # Redrives applied, by RedriveRun command id: a repeat gets the recorded reply. Their
    # number also scopes the fact keys of the run's later facts (``keys.in_redrive``).
    redrives: dict[str, RecordedResolution] = {}
    traceparent: str | None = None  # W3C trace context given at submit: the run's trace
    # Attempts lost to the infrastructure (not charged to any step's retry budget).
    infrastructure_losses: int = 0
    # Set while the run is quarantined: no timer, every input but ReleaseRun refused.
    quarantine: Quarantine | None = None
    # A graph run's steps in flight, by segment, and where its steps stand, by step
    # (both empty for a chain: its one lane is the flat fields above).
    lanes: dict[int, Lane] = {}
    nodes: dict[int, NodeRun] = {}
    # A child run's parent (``model/children.py``); None for a run nobody started.
    parent: ParentLink | None = None
    # The schedule whose fire started the run (``model/schedule_link.py``); None if none.
    schedule: ScheduleLink | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def stopping(self) -> bool:
        """Stop intent committed (cancel, deadline or failure) and not yet terminal."""
        return self.stop.reason is not None and not self.terminal

    def attempt_of(self, kind: AttemptKind) -> Attempt:
        """The run's current attempt of ``kind``, the same shape for both kinds."""
        if kind == FORWARD:
            forward = self.attempt
            return Attempt(
                kind,
                forward.segment,
                forward.number,
                forward.generation,
                forward.expires_ms,
                forward.retry_due_ms,
                running=self.phase == "dispatched",
                waiting=self.phase == "retry_wait",
                started_step=forward.started_step,
                worker_id=forward.worker_id,
                heartbeat_due_ms=forward.heartbeat_due_ms,
            )
        unwind = self.compensation
        return Attempt(
            kind,
            unwind.step or 0,
            unwind.attempt,
            unwind.generation,
            unwind.expires_ms,
            unwind.retry_due_ms,
            running=self.phase == "compensating" and unwind.step is not None,
            waiting=self.phase == "compensation_retry_wait",
            # A compensator runs one step, its own: started once a worker reported it.
            started_step=None if unwind.worker_id is None else unwind.step,
            worker_id=unwind.worker_id,
            heartbeat_due_ms=unwind.heartbeat_due_ms,
        )

    @property
    def graph(self) -> bool:
        """Whether the run is a graph's (its steps have node states)."""
        return bool(self.nodes)

    def lane_view(self, segment: int) -> RunState:
        """The run as its lane ``segment`` sees it: the lane's fields in place of the
        flat ones (itself for a chain, or when no such lane is live)."""
        lane = self.lanes.get(segment)
        if lane is None:
            return self
        return self.evolve(
            {
                "phase": lane.phase,
                "attempt": lane.attempt,
                "boundary": lane.boundary,
                "sleep": lane.sleep,
                "unknown": lane.unknown,
                "last_output": lane.last_output,
            }
        )

    def lane_of(self, segment: int) -> int | None:
        """``segment`` if it is a live lane of this graph run, else None (a chain, or a
        lane that has settled): the lane a decision about that segment addresses."""
        return segment if segment in self.lanes else None

    def lane_views(self) -> list[RunState]:
        """The view of each live lane, in segment order (none for a chain)."""
        return [self.lane_view(segment) for segment in sorted(self.lanes)]

    def running_attempt(self) -> Attempt | None:
        """The attempt a worker runs now, forward or compensator, if any."""
        kind = RUNNING_PHASES.get(self.phase)
        if kind is None:
            return None
        attempt = self.attempt_of(kind)
        return attempt if attempt.running else None

    def open_interactions(self) -> Iterator[Interaction]:
        """The current boundary's interactions still open, in no particular order: for
        readers that take them as a set (a boundary may have thousands; no sort)."""
        number = self.boundary.number
        return (
            i for i in self.interactions.values() if i.boundary == number and i.status == "open"
        )

    def boundary_interactions(self) -> list[Interaction]:
        """The current boundary's interactions in item-index order."""
        number = self.boundary.number
        found = [i for i in self.interactions.values() if i.boundary == number]
        return sorted(found, key=lambda i: i.item_index)
