"""The stored form of a run: one flat JSON row, the one the compiled fold writes too.

``RunState`` is a small tree (attempt, boundary, publication, stop, compensation);
its row keeps every field at the top level, in this order, with the names the
row has always had (``native/src/state.rs`` reads and writes exactly these).
``row_json`` and ``state_of`` map one to the other; nothing else sees the row.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from processor.facts.trusted import builder
from processor.model.chunked_map import ChunkedMap
from processor.model.parent_link import ParentLink
from processor.model.schedule_link import ScheduleLink
from processor.model.state import (
    RUNNING,
    Boundary,
    Compensation,
    ForwardAttempt,
    Interaction,
    Lane,
    NodeRun,
    Phase,
    Publication,
    Quarantine,
    RecordedResolution,
    RunState,
    RunStatus,
    Sleep,
    Stop,
    UnknownAttempt,
)

__all__ = ["RunRow", "row_json", "state_of", "states_of"]

_CONFIG = ConfigDict(frozen=True, extra="forbid", ser_json_bytes="base64", val_json_bytes="base64")


class RunRow(BaseModel):
    """A run as stored: ``RunState``'s parts flattened, fields at their default left out."""

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
    retry_reason: str | None = None  # the last retry decision (README: retry reasons)
    completed_steps: tuple[int, ...] = ()
    boundary: int = 0
    boundary_step: int | None = None
    boundary_kind: str = "await"
    boundary_itemized: bool = False
    boundary_items: int = 0
    boundary_on_timeout: str = "fail"
    boundary_dispatched: bool = False
    boundary_total: int = 0
    boundary_settled: int = 0
    boundary_failed: int = 0
    sleep_step: int | None = None  # while sleeping
    sleep_wake_ms: int | None = None
    interactions: ChunkedMap[str, Interaction] = ChunkedMap()
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
    compensation_retry_reason: str | None = None
    compensated: int = 0
    skipped: int = 0
    compensation_failed: bool = False
    execution: str | None = None  # Completed | Failed | Cancelled | TimedOut, once terminal
    recovery: str | None = None  # NotRequired | Compensated | PartiallyCompensated | ...
    # Not in native/src/state.rs: the compiled fold cannot read a redriven run's row, so
    # it declines the batches that touch one and Python folds them (store/native_fold.py).
    redrives: dict[str, RecordedResolution] = {}
    traceparent: str | None = None  # W3C trace context given at submit
    attempt_started_step: int | None = None
    attempt_worker: str | None = None
    heartbeat_due_ms: int | None = None
    infrastructure_losses: int = 0
    compensation_worker: str | None = None  # the worker that reported the compensator started
    compensation_heartbeat_due_ms: int | None = None
    # Not in native/src/state.rs either: the compiled fold declines a quarantined run's
    # batches (its row and its RunQuarantined), Python folds them (store/native_fold.py).
    quarantine: Quarantine | None = None
    # Not in native/src/state.rs either: a graph run's lanes and steps; the compiled fold
    # declines its batches, Python folds them (store/native_fold.py).
    lanes: dict[int, Lane] = {}
    nodes: dict[int, NodeRun] = {}
    # Not in native/src/state.rs either: a child run's link to its parent; the compiled
    # fold declines its batches, Python folds them (store/native_fold.py).
    parent: ParentLink | None = None
    # Not in native/src/state.rs either: a scheduled run's link to its schedule; the
    # compiled fold declines its batches, Python folds them (store/native_fold.py).
    schedule: ScheduleLink | None = None


#: Each part of RunState: its model and (row field, part field) of each of its fields.
_PARTS: tuple[tuple[str, type[BaseModel], tuple[tuple[str, str], ...]], ...] = (
    (
        "attempt",
        ForwardAttempt,
        (
            ("segment", "segment"),
            ("attempt", "number"),
            ("generation", "generation"),
            ("next_step", "next_step"),
            ("step_attempts", "step_attempts"),
            ("attempt_expires_ms", "expires_ms"),
            ("retry_due_ms", "retry_due_ms"),
            ("attempt_started_step", "started_step"),
            ("attempt_worker", "worker_id"),
            ("heartbeat_due_ms", "heartbeat_due_ms"),
            ("retry_reason", "retry_reason"),
        ),
    ),
    (
        "boundary",
        Boundary,
        (
            ("boundary", "number"),
            ("boundary_step", "step"),
            ("boundary_kind", "kind"),
            ("boundary_itemized", "itemized"),
            ("boundary_items", "items"),
            ("boundary_on_timeout", "on_timeout"),
            ("boundary_dispatched", "dispatched"),
            ("boundary_total", "total"),
            ("boundary_settled", "settled"),
            ("boundary_failed", "failed"),
        ),
    ),
    ("sleep", Sleep, (("sleep_step", "step"), ("sleep_wake_ms", "wake_ms"))),
    (
        "publication",
        Publication,
        (("publications", "targets"), ("publication_key", "key"), ("publication_due_ms", "due_ms")),
    ),
    ("stop", Stop, (("stop_reason", "reason"), ("stop_detail", "detail"))),
    (
        "compensation",
        Compensation,
        (
            ("compensation_started", "started"),
            ("unwind", "unwind"),
            ("compensating_step", "step"),
            ("compensation_attempt", "attempt"),
            ("compensation_generation", "generation"),
            ("compensation_expires_ms", "expires_ms"),
            ("compensation_retry_due_ms", "retry_due_ms"),
            ("compensation_retry_reason", "retry_reason"),
            ("compensated", "compensated"),
            ("skipped", "skipped"),
            ("compensation_failed", "failed"),
            ("compensation_worker", "worker_id"),
            ("compensation_heartbeat_due_ms", "heartbeat_due_ms"),
        ),
    ),
)
_PART_NAMES = tuple(name for name, _, _ in _PARTS)
#: RunState's own fields that are row fields of the same name.
_PLAIN = tuple(name for name in RunState.model_fields if name not in _PART_NAMES)
_SERIALIZER = RunRow.__pydantic_serializer__
_validate = RunRow.model_validate_json
_build_row = builder(RunRow)
_build_state = builder(RunState)


def _compile_mappings() -> tuple[Any, Any]:
    """The two field mappings as functions of one dictionary display each: the row's
    fields from the state's (in RunRow's order: pydantic-core writes a model's fields in
    the order of its dictionary) and the state's from the row's (in RunState's order).
    Written out, they cost a third of what a loop over the fields costs, on every store
    read and write of a run."""
    part_of = {row: (name, part) for name, _, pairs in _PARTS for row, part in pairs}
    to_row = [
        f"{row!r}: " + (f"f[{row!r}]" if row not in part_of else "p_{}[{!r}]".format(*part_of[row]))
        for row in RunRow.model_fields
    ]
    parts = "".join(f"    p_{name} = f[{name!r}].__dict__\n" for name in _PART_NAMES)
    to_state = []
    for name in RunState.model_fields:
        if name in _PART_NAMES:
            pairs = next(pairs for part, _, pairs in _PARTS if part == name)
            fields = ", ".join(f"{part!r}: f[{row!r}]" for row, part in pairs)
            to_state.append(f"{name!r}: b_{name}({{{fields}}})")
        else:
            to_state.append(f"{name!r}: f[{name!r}]")
    source = (
        f"def row_fields(f):\n{parts}    return {{{', '.join(to_row)}}}\n"
        f"def state_fields(f):\n    return {{{', '.join(to_state)}}}\n"
    )
    namespace: dict[str, Any] = {f"b_{name}": builder(model) for name, model, _ in _PARTS}
    exec(compile(source, "<run_row>", "exec"), namespace)  # only our own field names
    return namespace["row_fields"], namespace["state_fields"]


_row_fields, _state_fields = _compile_mappings()


def row_json(state: RunState) -> bytes:
    """The stored JSON of ``state``: ``RunRow.model_dump_json(exclude_defaults=True)``,
    in one call into pydantic-core. Fields at their default are left out (validation
    fills them back in): a finished run takes ~1.5 KB instead of ~2.2 KB, and every
    replay writes each run at least once."""
    return _SERIALIZER.to_json(_build_row(_row_fields(state.__dict__)), exclude_defaults=True)


def state_of(raw: bytes) -> RunState:
    """The run stored as ``raw`` (a row ``row_json`` or the compiled fold wrote)."""
    # The values come from a validated row, with the types RunState's parts declare.
    return _build_state(_state_fields(_validate(raw).__dict__))


def states_of(raws: list[bytes | None]) -> list[RunState | None]:
    """``state_of`` of each stored run, None where there is none."""
    return [None if raw is None else state_of(raw) for raw in raws]
