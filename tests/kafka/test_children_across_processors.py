"""A child whose parent's partition another processor owns (Kafka).

Two processor loops of one group, each with its own store, own one partition each.
A parent on one partition starts a child on the other: the child's outcome cannot be
decided where the child ends (``ProcessorLoop._here`` takes only runs of its own
partitions), so it goes out on runs.completions, and the parent's owner admits it
from there. ``tests/conformance/test_children.py`` has the other case: one loop owns
both, and nothing goes through the topic.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from processor.clients.client import new_submit
from processor.facts import payload
from processor.facts.codec import encode
from processor.facts.models import BoundaryCompletion
from processor.facts.topics import TopicName
from processor.model.children import child_run_id
from processor.model.state import RunState
from processor.transport.base import TopicPartition
from processor.transport.partitioner import partition_for
from tests.apps.child_pipelines import app
from tests.apps.support import FakeClock, LoopHarness, decode_records, transport_settings

pytestmark = pytest.mark.kafka

T = TypeVar("T")
#: From a rebalance or an input to what it leads to.
WITHIN_S = 60.0


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[LoopHarness, LoopHarness]]:
    settings = transport_settings("kafka", tmp_path / "first")
    assert settings.partitions == 2
    clock = FakeClock()
    first = LoopHarness(settings.data_dir, app, clock, settings=settings)
    other = settings.model_copy(update={"data_dir": tmp_path / "second" / "data"})
    second = LoopHarness(other.data_dir, app, clock, settings=other, instance_id="processor-2")
    try:
        yield first, second
    finally:
        second.close()
        first.close()


def _drive(loops: tuple[LoopHarness, ...], condition: Callable[[], T], what: str) -> T:
    """Run every loop once a round, and every work item as a worker would, until
    ``condition`` holds (bounded by a deadline)."""
    deadline = time.monotonic() + WITHIN_S
    while time.monotonic() < deadline:
        for h in loops:
            h.loop.run_once()
        for item in loops[0].new_work():  # segments.work of every partition
            loops[0].complete(item)
        value = condition()
        if value:
            return value
    raise AssertionError(f"the loops never reached: {what}")


def _owner(loops: tuple[LoopHarness, ...], run_id: str) -> LoopHarness:
    partition = partition_for(run_id.encode(), loops[0].deployment.topology.partitions)
    (owner,) = [h for h in loops if partition in h.loop.owned_partitions]
    return owner


def test_a_childs_outcome_for_a_parent_elsewhere_goes_through_runs_completions(
    pair: tuple[LoopHarness, LoopHarness],
) -> None:
    first, second = pair
    loops = (first, second)
    _drive(
        loops,
        lambda: [h.loop.owned_partitions for h in loops] in ([[0], [1]], [[1], [0]]),
        "a partition each",
    )
    # A parent whose child lands on the other partition (the child's id is derived).
    partitions = first.deployment.topology.partitions
    command = new_submit("parent", 21)
    while partition_for(command.run_id.encode(), partitions) == partition_for(
        child_run_id(command.run_id, 1, 0).encode(), partitions
    ):
        command = new_submit("parent", 21)
    run_id, child = command.run_id, child_run_id(command.run_id, 1, 0)
    first.produce(TopicName.COMMANDS, run_id, encode(command))

    def ended() -> RunState | None:
        state = _owner(loops, run_id).loop_state(run_id)
        return state if state is not None and state.terminal else None

    parent = _drive(loops, ended, "the parent ends")
    assert parent is not None and parent.status == "succeeded", parent
    assert payload.loads(parent.result or b"") == {"got": 42}
    kid = _owner(loops, child).loop_state(child)
    assert kid is not None and kid.status == "succeeded"
    assert _owner(loops, child) is not _owner(loops, run_id)

    topology = first.deployment.topology
    tp = TopicPartition(
        topology.name(TopicName.COMPLETIONS), partition_for(run_id.encode(), partitions)
    )
    records = [r for batch in first.reader.read(tp, 0) for r in batch if r.key == run_id.encode()]
    (completion,) = decode_records(records, BoundaryCompletion)
    assert completion.idempotency_key == f"child/{child}"
    assert completion.outcome == "success"
