"""Logical topic names. Deployments may prefix them (``Topics.physical``)."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["RUN_ADDRESSED_INPUTS", "TopicName"]


class TopicName(StrEnum):
    COMMANDS = "runs.commands"
    FACTS = "runs.facts"
    WORK = "segments.work"
    CONTROL = "segments.control"
    RESULTS = "segments.results"
    OUTCOMES = "runs.results"
    REPLIES = "runs.replies"
    DLQ = "runs.dlq"
    REJECTED = "admission.rejected"
    REQUESTS = "boundary.requests"
    COMPLETIONS = "boundary.completions"
    CHECKPOINTS = "boundary.checkpoints"
    SCHEDULES = "runs.schedules"  # keyed by schedule id (processor/engine/schedules.py)
    EVENTS = "boundary.events"


# Inputs of the processor; all keyed by run id and co-partitioned with runs.facts.
RUN_ADDRESSED_INPUTS: tuple[TopicName, ...] = (
    TopicName.COMMANDS,
    TopicName.RESULTS,
    TopicName.COMPLETIONS,
    TopicName.CHECKPOINTS,
    TopicName.EVENTS,
)
