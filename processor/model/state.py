"""The run projection: everything decide needs to know about one run."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

__all__ = ["FAILED", "RUNNING", "SUCCEEDED", "TERMINAL", "Phase", "RunState", "RunStatus"]

RunStatus = Literal["running", "succeeded", "failed"]
RUNNING: RunStatus = "running"
SUCCEEDED: RunStatus = "succeeded"
FAILED: RunStatus = "failed"
TERMINAL: frozenset[str] = frozenset({SUCCEEDED, FAILED})

# What the current segment is doing: waiting for a worker result, waiting for a
# retry timer, or nothing (between facts of one decision, or terminal).
Phase = Literal["dispatched", "retry_wait", "idle"]


class RunState(BaseModel):
    """Projection of one run, folded from its facts by ``reduce``."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", ser_json_bytes="base64", val_json_bytes="base64"
    )

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
    result: bytes | None = None
    error: str | None = None
    error_type: str | None = None
    failed_step: int | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL
