"""Fact keys: deterministic names of logical facts, unique within a run.

Only engine-generated integers appear in them, never user-supplied strings.
"""

from __future__ import annotations

__all__ = [
    "SUBMITTED",
    "TERMINAL",
    "attempt_failed",
    "attempt_started",
    "retry_scheduled",
    "segment_completed",
    "step_completed",
]

SUBMITTED = "submitted"
TERMINAL = "terminal"


def attempt_started(segment: int, generation: int) -> str:
    return f"segment/{segment}/generation/{generation}/started"


def attempt_failed(segment: int, generation: int) -> str:
    return f"segment/{segment}/generation/{generation}/failed"


def retry_scheduled(segment: int, generation: int) -> str:
    return f"segment/{segment}/generation/{generation}/retry"


def step_completed(step: int) -> str:
    return f"step/{step}/completed"


def segment_completed(segment: int) -> str:
    return f"segment/{segment}/completed"
