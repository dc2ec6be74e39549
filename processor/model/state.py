"""The run projection: everything decide needs to know about one run."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

__all__ = [
    "FAILED",
    "RUNNING",
    "SUCCEEDED",
    "TERMINAL",
    "Interaction",
    "Phase",
    "RunState",
    "RunStatus",
]

RunStatus = Literal["running", "succeeded", "failed"]
RUNNING: RunStatus = "running"
SUCCEEDED: RunStatus = "succeeded"
FAILED: RunStatus = "failed"
TERMINAL: frozenset[str] = frozenset({SUCCEEDED, FAILED})

# What the run waits for: a worker result, a retry timer, outside input at a
# boundary, the terminal publication, or nothing (terminal).
Phase = Literal["dispatched", "retry_wait", "suspended", "publishing", "idle"]
InteractionStatus = Literal["open", "admitted", "timed_out"]

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

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def boundary_interactions(self) -> list[Interaction]:
        """The current boundary's interactions in item-index order."""
        found = [i for i in self.interactions.values() if i.boundary == self.boundary]
        return sorted(found, key=lambda i: i.item_index)
