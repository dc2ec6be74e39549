"""What a fact changes is typed: mypy refuses a field the model does not declare (or a
value of another type), and the paths that build changes as data refuse one at run time.

Each projection model names its changes, a TypedDict of its fields, as the parameter
of ``Evolvable``; reducers return ``RunChanges`` and build parts with the models'
typed ``evolve`` and ``assemble``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import pytest
from pydantic import BaseModel

from processor.facts.trusted import Evolvable
from processor.model import state as state_module
from processor.model.state import Sleep

ROOT = Path(__file__).resolve().parents[2]


def _changes_of(model: type[BaseModel]) -> Any:
    """The TypedDict ``model`` names as its changes: the parameter of its Evolvable base."""
    for base in getattr(model, "__orig_bases__", ()):
        if get_origin(base) is Evolvable:
            return get_args(base)[0]
    return None


def _models() -> list[type[BaseModel]]:
    """Every model of the run projection (each one state.py defines)."""
    found = vars(state_module).values()
    return [
        m
        for m in found
        if isinstance(m, type)
        and issubclass(m, BaseModel)
        and m.__module__ == state_module.__name__
    ]


@pytest.mark.parametrize("model", _models(), ids=lambda model: model.__name__)
def test_each_model_declares_its_changes_with_exactly_its_fields_and_types(
    model: type[BaseModel],
) -> None:
    changes = _changes_of(model)
    assert changes is not None, f"{model.__name__} is not Evolvable[its changes]"
    declared = {name: field.annotation for name, field in model.model_fields.items()}
    assert get_type_hints(changes) == declared
    assert changes.__required_keys__ == frozenset()  # any subset of the fields


def test_the_check_of_types_would_see_a_difference() -> None:
    assert get_type_hints(_changes_of(Sleep)) != {"step": int | None, "wake_ms": int}


def test_the_models_own_evolve_and_assemble_refuse_an_undeclared_field() -> None:
    assert Sleep().evolve({"wake_ms": 5}) == Sleep(wake_ms=5)
    assert Sleep.assemble({"step": 1}) == Sleep(step=1)
    with pytest.raises(TypeError, match="wake_msx"):
        Sleep().evolve({"wake_msx": 5})  # type: ignore[typeddict-unknown-key]
    with pytest.raises(TypeError, match="wake_msx"):
        Sleep.assemble({"step": 1, "wake_msx": 5})  # type: ignore[typeddict-unknown-key]


#: Reducers as reduce.py writes them; the lines marked ``# error`` must not pass mypy.
_CHECKED = """
from processor.model.state import RunChanges, RunState


def well_typed(state: RunState) -> RunChanges:
    return {"phase": "sleeping", "sleep": state.sleep.evolve({"wake_ms": 5})}


def misspelled_part_field(state: RunState) -> RunChanges:
    return {"sleep": state.sleep.evolve({"wake_msx": 5})}  # error: typeddict-unknown-key


def misspelled_run_field(state: RunState) -> RunChanges:
    return {"phasex": "idle"}  # error: typeddict-unknown-key


def undeclared_phase(state: RunState) -> RunChanges:
    return {"phase": "sleepin"}  # error: typeddict-item


def mistyped_part_field(state: RunState) -> RunChanges:
    return {"attempt": state.attempt.evolve({"next_step": "1"})}  # error: typeddict-item


def misspelled_when_assembled(state: RunState) -> RunChanges:
    return {"stop": state.stop.assemble({"reasonx": "cancelled"})}  # error: typeddict-unknown-key
"""


@pytest.mark.slow  # mypy over the package: a few seconds with its cache, a minute without
def test_mypy_refuses_an_undeclared_or_mistyped_change(tmp_path: Path) -> None:
    source = tmp_path / "reducers.py"
    source.write_text(_CHECKED)
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), source],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    expected = {
        (number, line.rsplit("error: ", 1)[1])
        for number, line in enumerate(_CHECKED.splitlines(), start=1)
        if "# error: " in line
    }
    # By the file's name: mypy may report a module it found unchanged in its cache under
    # the path it had then (another tmp_path).
    found = {
        (int(match[1]), match[2])
        for match in re.finditer(r"reducers\.py:(\d+): error: .*\[([\w-]+)\]$", result.stdout, re.M)
    }
    assert found == expected, result.stdout + result.stderr
