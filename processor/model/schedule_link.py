"""A scheduled run's link to the schedule whose fire started it (pure).

The schedule stage submits the run of a fire time with the schedule's id and that
time (``SubmitRun.schedule_id``, ``fire_ms``); the run records ``ScheduledRunLinked``
right after its ``RunSubmitted``, and its projection keeps the link, which status, the
API and the inspector show.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["ScheduleLink"]


class ScheduleLink(BaseModel):
    """Which schedule started a run, for which of its fire times (ms since epoch)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schedule_id: str
    fire_ms: int
