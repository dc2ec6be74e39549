"""The stored row of a run: RunState's parts flattened, every field there and back.

The compiled fold (native/src/state.rs) reads and writes the same row, so its
fields, their names and their order are the contract; the tree is RunState's.
"""

from __future__ import annotations

import json
from typing import Any

from processor.facts.trusted import assemble
from processor.model.state import (
    Boundary,
    Compensation,
    ForwardAttempt,
    Publication,
    RunState,
    Stop,
)
from processor.store import run_row
from processor.store.run_row import RunRow, row_json, state_of

BASE: dict[str, Any] = {
    "run_id": "r",
    "pipeline": "p",
    "pipeline_version": 1,
    "input": b"{}",
    "submitted_ms": 1,
    "created_ms": 2,
    "updated_ms": 3,
    "submit_command_id": "c",
    "last_output": b"{}",
}

#: A value other than the default for every field of every part.
PARTS = {
    "attempt": ForwardAttempt(
        segment=2,
        number=3,
        generation=4,
        next_step=5,
        step_attempts=6,
        expires_ms=7,
        retry_due_ms=8,
    ),
    "boundary": Boundary(
        number=1,
        step=2,
        kind="checkpoint",
        itemized=True,
        items=3,
        on_timeout="skip",
        dispatched=True,
    ),
    "publication": Publication(targets={"t": "prepared"}, key="k", due_ms=9),
    "stop": Stop(reason="cancelled", detail="d"),
    "compensation": Compensation(
        started=True,
        unwind=(2, 1),
        step=2,
        attempt=1,
        generation=3,
        expires_ms=10,
        retry_due_ms=11,
        compensated=1,
        skipped=2,
        failed=True,
        worker_id="w",
        heartbeat_due_ms=12,
    ),
}


def test_every_row_field_is_a_field_of_the_state_or_of_one_of_its_parts() -> None:
    part_fields = [row for _, _, pairs in run_row._PARTS for row, _ in pairs]
    assert len(part_fields) == len(set(part_fields))
    assert set(RunRow.model_fields) == set(run_row._PLAIN) | set(part_fields)
    for name, model, pairs in run_row._PARTS:
        assert RunState.model_fields[name].annotation is model
        assert {part for _, part in pairs} == set(model.model_fields)


def test_every_part_field_round_trips_through_its_row_field() -> None:
    state = assemble(RunState, {**BASE, **PARTS})
    stored = row_json(state)
    row = json.loads(stored)
    assert row["segment"] == 2 and row["attempt"] == 3 and row["attempt_expires_ms"] == 7
    assert row["boundary"] == 1 and row["boundary_kind"] == "checkpoint"
    assert row["publications"] == {"t": "prepared"} and row["publication_due_ms"] == 9
    assert row["stop_reason"] == "cancelled" and row["stop_detail"] == "d"
    assert row["unwind"] == [2, 1] and row["compensating_step"] == 2
    assert row["compensation_failed"] is True and row["skipped"] == 2
    assert row["compensation_worker"] == "w" and row["compensation_heartbeat_due_ms"] == 12
    assert not any(name in row for name in PARTS if name not in ("attempt", "boundary"))
    assert state_of(stored) == state


def test_a_new_run_stores_no_part_field() -> None:
    stored = row_json(assemble(RunState, BASE))
    assert set(json.loads(stored)) == set(BASE)
    assert state_of(stored) == assemble(RunState, BASE)
