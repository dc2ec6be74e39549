"""The run projection: everything decide needs to know about one run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

__all__ = [
    "COMPENSATE",
    "FAILED",
    "FORWARD",
    "RUNNING",
    "SUCCEEDED",
    "TERMINAL",
    "Attempt",
    "AttemptKind",
    "Interaction",
    "Phase",
    "RecordedResolution",
    "RunState",
    "RunStatus",
    "UnknownAttempt",
]

RunStatus = Literal["running", "succeeded", "failed", "cancelled", "timed_out"]
RUNNING: RunStatus = "running"
SUCCEEDED: RunStatus = "succeeded"
FAILED: RunStatus = "failed"
TERMINAL: frozenset[str] = frozenset({SUCCEEDED, FAILED, "cancelled", "timed_out"})

# What the run waits for: a worker result, a retry timer, outside input at a
# boundary, the terminal publication, an operator (unknown outcome), a
# compensator (or its retry timer), or nothing.
Phase = Literal[
    "dispatched",
    "retry_wait",
    "suspended",
    "publishing",
    "unknown",
    "compensating",
    "compensation_retry_wait",
    "idle",
]
InteractionStatus = Literal["open", "admitted", "timed_out"]

#: The two kinds of attempt a run makes: forward segments, and compensators of the unwind.
AttemptKind = Literal["forward", "compensate"]
FORWARD: AttemptKind = "forward"
COMPENSATE: AttemptKind = "compensate"


@dataclass(frozen=True, slots=True)
class Attempt:
    """The current attempt of one kind, whatever its kind: ``RunState.attempt_of``.

    ``scope`` is what the attempt runs: the segment of a forward attempt, the
    compensated step of a compensator.
    """

    kind: AttemptKind
    scope: int
    number: int
    generation: int
    expires_ms: int | None  # while it runs
    retry_due_ms: int | None  # while it waits to be tried again
    running: bool  # dispatched to a worker, its result awaited
    waiting: bool  # failed, its next try after backoff


_CONFIG = ConfigDict(frozen=True, extra="forbid", ser_json_bytes="base64", val_json_bytes="base64")


class Interaction(BaseModel):
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


class UnknownAttempt(BaseModel):
    """The attempt an operator must resolve: no automatic retry."""

    model_config = _CONFIG

    kind: str
    segment: int
    attempt: int
    generation: int
    step: int


class RecordedResolution(BaseModel):
    """An operator command already applied: a repeat returns the same response."""

    model_config = _CONFIG

    fingerprint: str
    response: str


class RunState(BaseModel):
    """Projection of one run, folded from its facts by ``reduce``."""

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
    segment: int = 0
    attempt: int = 0
    generation: int = 0
    next_step: int = 0
    step_attempts: int = 0  # attempts that have tried ``next_step``: the retry budget used
    last_output: bytes
    phase: Phase = "idle"
    attempt_expires_ms: int | None = None
    retry_due_ms: int | None = None
    completed_steps: tuple[int, ...] = ()
    boundary: int = 0
    boundary_step: int | None = None
    boundary_kind: str = "await"
    boundary_itemized: bool = False
    boundary_items: int = 0
    boundary_on_timeout: str = "fail"
    boundary_dispatched: bool = False
    interactions: dict[str, Interaction] = {}
    publications: dict[str, str] = {}  # topic -> "prepared" | "completed"
    publication_key: str | None = None
    publication_due_ms: int | None = None
    result: bytes | None = None
    error: str | None = None
    error_type: str | None = None
    failed_step: int | None = None
    failed_attempts: int = 0
    deadline_ms: int | None = None
    stop_reason: str | None = None  # cancelled | timed_out | failed: the first one decides
    stop_detail: str | None = None
    unknown: UnknownAttempt | None = None
    step_outputs: dict[int, bytes] = {}
    resolutions: dict[str, RecordedResolution] = {}
    unwind: tuple[int, ...] = ()  # steps still to compensate, next first
    compensation_started: bool = False
    compensating_step: int | None = None
    compensation_attempt: int = 0
    compensation_generation: int = 0
    compensation_expires_ms: int | None = None
    compensation_retry_due_ms: int | None = None
    compensated: int = 0
    skipped: int = 0
    compensation_failed: bool = False
    execution: str | None = None  # Completed | Failed | Cancelled | TimedOut, once terminal
    recovery: str | None = None  # NotRequired | Compensated | PartiallyCompensated | ...

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def stopping(self) -> bool:
        """Stop intent committed (cancel, deadline or failure) and not yet terminal."""
        return self.stop_reason is not None and not self.terminal

    def attempt_of(self, kind: AttemptKind) -> Attempt:
        """The run's current attempt of ``kind`` (its fields kept flat for the store's row)."""
        if kind == FORWARD:
            return Attempt(
                kind,
                self.segment,
                self.attempt,
                self.generation,
                self.attempt_expires_ms,
                self.retry_due_ms,
                running=self.phase == "dispatched",
                waiting=self.phase == "retry_wait",
            )
        return Attempt(
            kind,
            self.compensating_step or 0,
            self.compensation_attempt,
            self.compensation_generation,
            self.compensation_expires_ms,
            self.compensation_retry_due_ms,
            running=self.phase == "compensating" and self.compensating_step is not None,
            waiting=self.phase == "compensation_retry_wait",
        )

    def boundary_interactions(self) -> list[Interaction]:
        """The current boundary's interactions in item-index order."""
        found = [i for i in self.interactions.values() if i.boundary == self.boundary]
        return sorted(found, key=lambda i: i.item_index)
