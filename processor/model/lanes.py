"""Which segment a graph step's lane is, and an item's of a fan-out step. Pure.

A graph step runs in segment ``step + 1``; item ``i`` of a fan-out step in segment
``(step + 1) * ITEM_SEGMENTS + i``, so every lane of a run has a segment of its own
(an Avro int: a fan-out step has fewer than ``ITEM_SEGMENTS`` items, and a graph
fewer than 2,000 steps).
"""

from __future__ import annotations

__all__ = [
    "ITEM_SEGMENTS",
    "REDRIVE_GENERATIONS",
    "first_generation",
    "item_of",
    "item_segment",
    "items_of_step",
    "segment_of",
    "step_of",
]

#: The segments of one fan-out step's items: also one more than its most items.
ITEM_SEGMENTS = 1_000_000
#: The generations of a lane within one redrive: a redriven run's lanes begin past the
#: generations of the lanes they replace, so a late result of those is stale.
REDRIVE_GENERATIONS = 1_000_000


def first_generation(redrives: int) -> int:
    """The generation of a lane's first attempt in a run redriven ``redrives`` times."""
    return 1 + redrives * REDRIVE_GENERATIONS


def segment_of(step: int) -> int:
    """The lane (segment) a graph step runs in: one per step, never reused."""
    return step + 1


def item_segment(step: int, item: int) -> int:
    """The lane of item ``item`` of the fan-out step ``step``."""
    return (step + 1) * ITEM_SEGMENTS + item


def step_of(segment: int) -> int:
    """The graph step that runs in lane ``segment`` (a step's, or one of its items')."""
    return segment - 1 if segment < ITEM_SEGMENTS else segment // ITEM_SEGMENTS - 1


def item_of(segment: int) -> int | None:
    """The fan-out item that runs in lane ``segment``, if it is an item's."""
    return None if segment < ITEM_SEGMENTS else segment % ITEM_SEGMENTS


def items_of_step(segment: int, step: int) -> bool:
    """Whether ``segment`` is the lane of an item of ``step``."""
    return segment >= ITEM_SEGMENTS and step_of(segment) == step
