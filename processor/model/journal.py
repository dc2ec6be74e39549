"""Conditional append: duplicates by fact key are no-ops, stale versions conflict."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from processor.errors import AppendConflictError
from processor.facts.models import FactHeader

__all__ = ["plan_append"]


def plan_append(
    facts: Sequence[FactHeader],
    expected_version: int,
    current_version: int,
    key_exists: Callable[[str], bool],
) -> list[FactHeader]:
    """The facts to actually append, renumbered after ``current_version``.

    Facts whose key is already in the journal are dropped (retrying the same
    append is a no-op). If anything new remains and the caller decided against a
    stale version, raise AppendConflictError and append nothing.
    """
    fresh = [fact for fact in facts if not key_exists(fact.fact_key)]
    if not fresh:
        return []
    if expected_version != current_version:
        raise AppendConflictError(
            f"run {fresh[0].run_id}: expected version {expected_version}, "
            f"journal is at {current_version}"
        )
    return [
        fact
        if fact.seq == current_version + i
        else fact.model_copy(update={"seq": current_version + i})
        for i, fact in enumerate(fresh, start=1)
    ]
