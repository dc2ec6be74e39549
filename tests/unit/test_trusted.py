"""Building models from trusted values gives exactly what validation and model_copy give."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError

from processor.facts import trusted
from processor.facts.trusted import SLOT_SETTERS, assemble, evolve
from processor.model.chunked_map import ChunkedMap
from processor.model.state import ForwardAttempt, Interaction, RunState, Sleep, Stop
from processor.store.run_row import RunRow, row_json, state_of

RUN: dict[str, Any] = {
    "run_id": "run-1",
    "pipeline": "orders",
    "pipeline_version": 3,
    "version": 1,
    "input": b'{"n": 1}',
    "submitted_ms": 10,
    "created_ms": 11,
    "updated_ms": 11,
    "idempotency_key": None,
    "fingerprint": "f",
    "submit_command_id": "c-1",
    "last_output": b'{"n": 1}',
    "deadline_ms": 99,
}


def same(left: BaseModel, right: BaseModel) -> bool:
    """Same type, same fields in the same order, same fields set, same JSON."""
    return (
        type(left) is type(right)
        and list(left.__dict__.items()) == list(right.__dict__.items())
        and left.__pydantic_fields_set__ == right.__pydantic_fields_set__
        and left.__pydantic_extra__ == right.__pydantic_extra__
        and left.__pydantic_private__ == right.__pydantic_private__
        and left.model_dump_json() == right.model_dump_json()
    )


def test_the_installed_pydantic_is_one_the_fast_path_knows() -> None:
    assert SLOT_SETTERS is not None  # else every helper silently takes the slow path


def test_assemble_builds_what_validation_builds() -> None:
    assert same(assemble(RunState, RUN), RunState(**RUN))
    interaction = {
        "boundary": 1,
        "item_index": 0,
        "kind": "await",
        "target": "payments",
        "deadline_ms": 5,
        "token_digest": b"\x01" * 32,
    }
    assert same(assemble(Interaction, interaction), Interaction(**interaction))


def test_assemble_refuses_what_validation_refuses() -> None:
    missing = {name: value for name, value in RUN.items() if name != "pipeline"}
    with pytest.raises(ValidationError, match="pipeline"):
        assemble(RunState, missing)


def test_evolve_and_assemble_write_no_field_the_model_does_not_declare() -> None:
    """A misspelled field is a bug: refused as ``dataclasses.replace`` refuses one, not
    written into the instance (``model_copy(update=...)`` would write it)."""
    with pytest.raises(TypeError, match="Sleep declares no field 'wake_msx'"):
        evolve(Sleep(), {"wake_msx": 5})
    with pytest.raises(TypeError, match="RunState declares no field 'unexpected'"):
        assemble(RunState, {**RUN, "unexpected": 1})
    with pytest.raises(TypeError, match="declares no field 'unexpected', 'wake_msx'"):
        evolve(Sleep(), {"unexpected": 1, "wake_ms": 2, "wake_msx": 2})


class _Private(BaseModel):
    """Off the slot-by-slot path (a private attribute): the public API builds it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step: int = 0
    _cache: int = PrivateAttr(default=0)


def test_off_the_fast_path_an_undeclared_field_is_refused_too() -> None:
    assert trusted._template(_Private) is None
    assert evolve(_Private(), {"step": 2}).step == 2
    with pytest.raises(TypeError, match="_Private declares no field 'stepx'"):
        evolve(_Private(), {"stepx": 2})
    with pytest.raises(TypeError, match="_Private declares no field 'stepx'"):
        assemble(_Private, {"stepx": 2})


def test_evolve_builds_what_model_copy_builds() -> None:
    state = RunState(**RUN)
    changes = {"version": 2, "phase": "dispatched", "completed_steps": (0,), "error": "x"}
    evolved = evolve(state, changes)
    assert same(evolved, state.model_copy(update=changes))
    assert state.version == 1  # the original is untouched


def test_defaults_are_not_mutated_through_instances() -> None:
    first = assemble(RunState, RUN)
    second = evolve(first, {"interactions": {"i": assemble(Interaction, _interaction())}})
    assert first.interactions == {} and assemble(RunState, RUN).interactions == {}
    assert list(second.interactions) == ["i"]


def _interaction() -> dict[str, Any]:
    return {
        "boundary": 0,
        "item_index": 0,
        "kind": "await",
        "target": "t",
        "deadline_ms": 0,
        "token_digest": b"",
    }


def test_stored_run_json_is_the_flat_row_without_defaults() -> None:
    parts = {"attempt": ForwardAttempt(segment=2, number=3), "stop": Stop(reason="cancelled")}
    outputs = {"step_outputs": {0: b"o"}}
    interactions = {"interactions": ChunkedMap({"i": assemble(Interaction, _interaction())})}
    state = evolve(assemble(RunState, RUN), {**interactions, **outputs, **parts})
    stored = row_json(state)
    flat = {"segment": 2, "attempt": 3, "stop_reason": "cancelled"}
    row = RunRow(**RUN, **interactions, **outputs, **flat)
    assert stored == row.model_dump_json(exclude_defaults=True).encode()
    assert b'"status"' not in stored and len(stored) < len(row.model_dump_json())
    assert state_of(stored) == state
