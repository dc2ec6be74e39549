"""Fact keys: deterministic names of logical facts, unique within a run.

Only engine-generated integers appear in them, never user-supplied strings.
"""

from __future__ import annotations

__all__ = [
    "SUBMITTED",
    "TERMINAL",
    "attempt_failed",
    "attempt_started",
    "boundary_continued",
    "boundary_dispatched",
    "boundary_suspended",
    "definition_blocked",
    "in_redrive",
    "interaction_admitted",
    "interaction_dispatched",
    "interaction_id",
    "interaction_timed_out",
    "publication_completed",
    "publication_prepared",
    "redriven",
    "retry_scheduled",
    "segment_completed",
    "sleep_completed",
    "sleep_started",
    "step_completed",
]

SUBMITTED = "submitted"
TERMINAL = "terminal"


def attempt_started(segment: int, generation: int) -> str:
    return f"segment/{segment}/generation/{generation}/started"


def attempt_failed(segment: int, generation: int) -> str:
    return f"segment/{segment}/generation/{generation}/failed"


def _attempt(kind: str, scope: int, generation: int) -> str:
    """An attempt of either kind: a forward segment's, or the compensator of step ``scope``
    (``compensate/...``, as its other facts): their numbers may coincide."""
    prefix = "segment" if kind == "forward" else "compensate"
    return f"{prefix}/{scope}/generation/{generation}"


def step_started(kind: str, scope: int, generation: int, step: int, version: int) -> str:
    """A start report (a step may be started again by another worker: ``version`` is the
    run's version when it was recorded, so each record has its own key)."""
    return f"{_attempt(kind, scope, generation)}/step/{step}/started/{version}"


def heartbeat_recorded(kind: str, scope: int, generation: int, due_ms: int) -> str:
    return f"{_attempt(kind, scope, generation)}/heartbeat/{due_ms}"


def attempt_lost(kind: str, scope: int, generation: int) -> str:
    return f"{_attempt(kind, scope, generation)}/lost"


def definition_blocked(segment: int, generation: int) -> str:
    return f"segment/{segment}/generation/{generation}/definition_blocked"


def quarantined(seq: int) -> str:
    """A quarantine, named by its own seq: a run may be quarantined again after a release."""
    return f"quarantined/{seq}"


def released(quarantined_seq: int) -> str:
    return f"quarantined/{quarantined_seq}/released"


def retry_scheduled(segment: int, generation: int) -> str:
    return f"segment/{segment}/generation/{generation}/retry"


def step_completed(step: int) -> str:
    return f"step/{step}/completed"


def node_ready(step: int) -> str:
    return f"node/{step}/ready"


def item_ready(step: int, item: int) -> str:
    return f"node/{step}/item/{item}/ready"


def item_settled(step: int, item: int) -> str:
    return f"node/{step}/item/{item}/settled"


def node_skipped(step: int) -> str:
    return f"node/{step}/skipped"


def node_settled(step: int) -> str:
    return f"node/{step}/settled"


def route_decided(step: int) -> str:
    return f"node/{step}/routes"


def catch_decided(step: int) -> str:
    return f"node/{step}/caught"


GRAPH_SETTLED = "graph/settled"


def segment_completed(segment: int) -> str:
    return f"segment/{segment}/completed"


def interaction_id(boundary: int, item_index: int) -> str:
    """Interaction ids are engine-made: the boundary number and the item index."""
    return f"b{boundary}.{item_index}"


def boundary_suspended(boundary: int) -> str:
    return f"boundary/{boundary}/suspended"


def boundary_dispatched(boundary: int) -> str:
    return f"boundary/{boundary}/dispatched"


def boundary_continued(boundary: int) -> str:
    return f"boundary/{boundary}/continued"


def sleep_started(segment: int) -> str:
    """A segment ends at one sleep step at most: its sleep is named by the segment."""
    return f"sleep/{segment}/started"


def sleep_completed(segment: int) -> str:
    return f"sleep/{segment}/completed"


def interaction_queued(interaction: str) -> str:
    return f"interaction/{interaction}/queued"


def interaction_dispatched(interaction: str) -> str:
    return f"interaction/{interaction}/dispatched"


def interaction_admitted(interaction: str) -> str:
    return f"interaction/{interaction}/admitted"


def interaction_timed_out(interaction: str) -> str:
    return f"interaction/{interaction}/timed_out"


def publication_prepared(topic: str) -> str:
    return f"publication/{topic}/prepared"


def publication_completed(topic: str) -> str:
    return f"publication/{topic}/completed"


STOP = "stop"
COMPENSATION = "compensation"


def attempt_unknown(kind: str, segment: int, generation: int) -> str:
    return f"{kind}/{segment}/generation/{generation}/unknown"


def attempt_resolved(kind: str, segment: int, generation: int) -> str:
    return f"{kind}/{segment}/generation/{generation}/resolved"


def compensation_attempt(step: int, generation: int) -> str:
    return f"compensate/{step}/generation/{generation}/started"


def compensation_failed(step: int, generation: int) -> str:
    return f"compensate/{step}/generation/{generation}/failed"


def compensation_done(step: int) -> str:
    return f"compensate/{step}/done"


def redriven(redrive: int) -> str:
    return f"redriven/{redrive}"


def in_redrive(redrive: int, key: str) -> str:
    """``key`` as a fact of the run after its ``redrive``-th redrive (0: none yet).

    A redrive runs steps again, and the run ends again: those facts must not meet the
    keys of the facts they repeat, which conditional append would drop as duplicates.
    """
    return key if redrive == 0 else f"redrive/{redrive}/{key}"
