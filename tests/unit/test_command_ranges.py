"""The Python client refuses, with a ValueError that says why, values no command can
carry (an Avro long of milliseconds, an Avro int step index), before producing."""

from __future__ import annotations

import pytest

from processor.clients.client import check_step_index, new_submit


@pytest.mark.parametrize("after_ms", [-1, 2**63, round(1e300 * 1000)])
def test_a_deadline_out_of_range_is_refused(after_ms: int) -> None:
    with pytest.raises(ValueError, match="a deadline must be from 0 to"):
        new_submit("steps3", {}, deadline_after_ms=after_ms)
    with pytest.raises(ValueError, match="a deadline must be from 0 to"):
        new_submit("steps3", {}, deadline_ms=after_ms)


def test_deadlines_in_range_are_kept() -> None:
    command = new_submit("steps3", {}, deadline_after_ms=0, deadline_ms=2**63 - 1)
    assert (command.deadline_after_ms, command.deadline_ms) == (0, 2**63 - 1)


@pytest.mark.parametrize("step", [-1, 2**31, 2**40])
def test_a_step_index_out_of_range_is_refused(step: int) -> None:
    with pytest.raises(ValueError, match=f"a step index must be from 0 to {2**31 - 1}, got"):
        check_step_index(step)


@pytest.mark.parametrize("step", [None, 0, 2**31 - 1])
def test_step_indexes_in_range_pass(step: int | None) -> None:
    check_step_index(step)
