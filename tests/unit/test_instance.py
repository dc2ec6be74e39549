"""A processor's instance id lives with its state directory, which one process holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from processor.engine.instance import claim_instance
from processor.errors import ConfigurationError


def test_the_id_is_generated_once_and_kept(tmp_path: Path) -> None:
    first = claim_instance(tmp_path / "state")
    first.release()
    again = claim_instance(tmp_path / "state")
    again.release()
    other = claim_instance(tmp_path / "elsewhere")
    other.release()
    assert first.instance_id == again.instance_id
    assert first.instance_id.startswith("processor-")
    assert other.instance_id != first.instance_id


def test_a_held_state_directory_is_refused_until_released(tmp_path: Path) -> None:
    held = claim_instance(tmp_path)
    with pytest.raises(ConfigurationError, match="another processor is running"):
        claim_instance(tmp_path)
    held.release()
    claim_instance(tmp_path).release()


def test_a_configured_id_wins_and_is_remembered(tmp_path: Path) -> None:
    generated = claim_instance(tmp_path)
    generated.release()
    configured = claim_instance(tmp_path, "pod-3")
    configured.release()
    remembered = claim_instance(tmp_path)
    remembered.release()
    assert (configured.instance_id, remembered.instance_id) == ("pod-3", "pod-3")
    assert generated.instance_id != "pod-3"


@pytest.mark.parametrize("bad", ["", "has space", "x" * 201, "a/b"])
def test_an_unusable_configured_id_is_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ConfigurationError, match="instance id"):
        claim_instance(tmp_path, bad)
    claim_instance(tmp_path).release()  # the refusal did not keep the lock
