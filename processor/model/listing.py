"""The runs index: the listing rows a run has, derived from its state (like ``due.py``).

Each row names one way of finding the run: by status, by pipeline and status, and,
while it waits at a boundary with an open interaction, by that interaction's target
(alone and with the pipeline). The store orders each kind's rows newest submitted
first (``store/keys.py``), so a listing is a range read, or a merge of a few: all
runs are the runs of every status, a pipeline's those of each of its statuses. Two
rows a run (plus its waits) keep a replay's writes low: each row is a write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from processor.model import event_waits, waits
from processor.model.state import RunState

__all__ = [
    "IndexEntry",
    "IndexKind",
    "blocked_parts",
    "index_entries",
    "is_unknown",
    "open_targets",
    "waiting_targets",
]

IndexKind = Literal[
    "status",
    "pipeline_status",
    "waiting",
    "waiting_pipeline",
    "blocked",
    "quarantined",
    "event_key",
]


@dataclass(frozen=True, slots=True, order=True)
class IndexEntry:
    """One row of the runs index.

    ``parts`` are what the kind lists by, in key order: (status,), (pipeline, status),
    (target,), (target, pipeline), () of a quarantined run, or (pipeline, version) of a
    ``definition_blocked`` run (``blocked_parts``: the processor wakes these when a
    worker loads the version).
    """

    kind: IndexKind
    parts: tuple[str, ...]
    submitted_ms: int
    run_id: str


def open_targets(state: RunState) -> frozenset[str]:
    """The targets of the run's open interactions at its current boundary (a graph run's:
    at each step's), an event wait's registration as it is (none unless it is suspended
    there and not terminal)."""
    if state.terminal:
        return frozenset()
    return frozenset(
        i.target for view in waits.in_wait(state, waits.SUSPENDED) for i in view.open_interactions()
    )


def waiting_targets(state: RunState) -> tuple[str, ...]:
    """The targets the run waits on, sorted, each once: ``open_targets``, an event wait's
    as ``event:<name>`` (its correlation values would make a target, and a metric label,
    per order number)."""
    return _listed(open_targets(state))


def _listed(targets: frozenset[str]) -> tuple[str, ...]:
    return tuple(sorted({event_waits.listed_target(t) for t in targets}))


def is_unknown(state: RunState | None) -> bool:
    """Whether the run (or a step of a graph run) waits for an operator: its attempt's
    outcome is Unknown."""
    return state is not None and not state.terminal and bool(waits.in_wait(state, waits.UNKNOWN))


def index_entries(state: RunState | None) -> frozenset[IndexEntry]:
    """Every index row of the run (none before it is submitted)."""
    if state is None:
        return frozenset()
    at, run_id = state.submitted_ms, state.run_id
    pipeline, status = state.pipeline, state.status
    rows = [
        IndexEntry("status", (status,), at, run_id),
        IndexEntry("pipeline_status", (pipeline, status), at, run_id),
    ]
    targets = open_targets(state)  # every interaction of the boundary: read them once
    for target in _listed(targets):
        rows.append(IndexEntry("waiting", (target,), at, run_id))
        rows.append(IndexEntry("waiting_pipeline", (target, pipeline), at, run_id))
    # An event wait keyed by correlation: found by (event name, key) (docs/design/signals.md).
    keyed = event_waits.keyed(targets)
    rows.extend(IndexEntry("event_key", parts, at, run_id) for parts in keyed)
    if waits.in_wait(state, waits.DEFINITION_BLOCKED) and not state.terminal:
        rows.append(
            IndexEntry("blocked", blocked_parts(pipeline, state.pipeline_version), at, run_id)
        )
    if state.quarantine is not None:
        rows.append(IndexEntry("quarantined", (), at, run_id))
    return frozenset(rows)


def blocked_parts(pipeline: str, version: int) -> tuple[str, str]:
    """The parts of the ``blocked`` index rows of a pipeline version."""
    return (pipeline, str(version))
