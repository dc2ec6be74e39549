"""Fan-out bookkeeping: which items to start, when the node has failed or settled.

A fan-out node maps a function over its items, each item an attempt of its own. At
most ``max_in_flight`` items are open (started, not settled) at once; the next ones to
start are the lowest indexes not started yet. Failures are counted against the
tolerance, inclusively (10% of 200 items passes at 20 failures and fails at 21; a
tolerance of 0 is fail-fast). Once the failures exceed it, the node has failed: no
further item starts (the ones already open are not interrupted, as in seed 004's
``ReconcileFailFast``), and the node settles when they have. Otherwise it settles
when every item has. Its output is released once, in item-index order, with the
failed items' errors. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, Literal, Self, TypeVar

from processor.model.graph import FanOutLimits

__all__ = [
    "FanOutOutput",
    "FanOutProgress",
    "ItemStatus",
    "assemble",
]

#: An item's status; an item missing from the map has not started.
ItemStatus = Literal["running", "succeeded", "failed"]
Output = TypeVar("Output")
Error = TypeVar("Error")


@dataclass(frozen=True, slots=True)
class FanOutProgress:
    """A fan-out node's items so far, as counts: items start in index order, so the
    ``started`` ones are the indexes below it, and ``succeeded`` and ``failures`` of
    them settled."""

    limits: FanOutLimits
    total: int
    started: int = 0
    succeeded: int = 0
    failures: int = 0

    @classmethod
    def of(cls, limits: FanOutLimits, total: int, items: Mapping[int, ItemStatus]) -> Self:
        """The progress of ``items`` (index to status), started lowest index first."""
        statuses = list(items.values())
        return cls(
            limits, total, len(statuses), statuses.count("succeeded"), statuses.count("failed")
        )

    @property
    def open(self) -> int:
        """Items started and not settled."""
        return self.started - self.succeeded - self.failures

    @property
    def failed(self) -> bool:
        """Whether the failures exceed the tolerance: the node has failed."""
        return not self.limits.tolerance.allows(self.failures, self.total)

    @property
    def settled(self) -> bool:
        """Whether the node is done: no item open, and every item settled or it failed."""
        if self.open:
            return False
        return self.failed or self.started == self.total

    def to_start(self) -> tuple[int, ...]:
        """The items to start now, lowest index first, keeping the limit; none once failed."""
        if self.failed:
            return ()
        room = max(self.limits.max_in_flight - self.open, 0)
        return tuple(range(self.started, min(self.total, self.started + room)))


@dataclass(frozen=True, slots=True)
class FanOutOutput(Generic[Output, Error]):
    """A settled fan-out's output: by item index, the failed items' errors beside it."""

    #: One per item, in index order; None where the item failed or never started.
    outputs: tuple[Output | None, ...]
    #: ``(index, error)`` of each failed item, in index order.
    errors: tuple[tuple[int, Error], ...]
    #: Items never started because the node failed first.
    not_started: tuple[int, ...]


def assemble(
    total: int, outputs: Mapping[int, Output], errors: Mapping[int, Error]
) -> FanOutOutput[Output, Error]:
    """The output of ``total`` items from the outputs and errors of those that settled."""
    return FanOutOutput(
        tuple(outputs.get(i) for i in range(total)),
        tuple((i, errors[i]) for i in range(total) if i in errors),
        tuple(i for i in range(total) if i not in outputs and i not in errors),
    )
