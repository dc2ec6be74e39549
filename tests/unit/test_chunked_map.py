"""A fan-out step's settled items: a map that reads as the dict it replaces, and whose
fold does not copy the items settled before (a fan-out of n items folds in less than
O(n^2))."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import given
from hypothesis import strategies as st

from processor.facts.models import BoundaryCompletionAdmitted, FanOutItemSettled
from processor.model.chunked_map import CHUNK, ChunkedMap
from processor.model.reduce import reduce
from processor.model.state import Boundary, Interaction, NodeRun, RunState
from processor.store.run_row import row_json, state_of

T = TypeVar("T")
ENTRIES = st.lists(st.tuples(st.integers(0, 3 * CHUNK), st.binary(max_size=3)), max_size=900)


def _grown(entries: list[tuple[int, bytes]]) -> tuple[ChunkedMap[int, bytes], dict[int, bytes]]:
    grown: ChunkedMap[int, bytes] = ChunkedMap()
    plain: dict[int, bytes] = {}
    for item, value in entries:
        grown = grown.with_item(item, value)
        plain = {**plain, item: value}
    return grown, plain


@given(ENTRIES)
def test_a_map_grown_item_by_item_reads_as_the_dict_grown_the_same_way(
    entries: list[tuple[int, bytes]],
) -> None:
    grown, plain = _grown(entries)
    assert grown == plain
    assert list(grown.items()) == list(plain.items())  # insertion order, as a dict's
    assert len(grown) == len(plain)
    assert grown.as_dict() == plain
    assert all(grown[item] == value for item, value in plain.items())
    assert all(item not in grown for item in range(-2, 0))
    assert ChunkedMap(plain) == grown


def test_adding_an_item_leaves_the_map_it_was_added_to_unchanged() -> None:
    small: ChunkedMap[int, str] = ChunkedMap({1: "a", 2: "b"})
    assert small.with_item(3, "c") == {1: "a", 2: "b", 3: "c"}
    assert small.with_item(1, "z") == {1: "z", 2: "b"}
    assert small == {1: "a", 2: "b"}


def _run(**fields: Any) -> RunState:
    """A run of pipeline ``p`` with ``fields`` set."""
    return RunState(
        run_id="r",
        pipeline="p",
        pipeline_version=1,
        input=b"[]",
        submitted_ms=1,
        created_ms=1,
        updated_ms=1,
        submit_command_id="c",
        last_output=b"null",
        **fields,
    )


def _fan_out_run(items: int) -> RunState:
    outputs = ChunkedMap({item: b"1" for item in range(items)})
    node = NodeRun(
        items=items + 1, started_items=items + 1, succeeded_items=items, item_outputs=outputs
    )
    return _run(nodes={1: node})


def _allocated(call: Callable[[], T]) -> tuple[int, T]:
    """The bytes ``call`` allocated and kept, and what it returned."""
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        result = call()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    return sum(stat.size_diff for stat in after.compare_to(before, "filename")), result


def _settle_last(state: RunState, item: int) -> RunState:
    fact = FanOutItemSettled(
        run_id="r", seq=state.version + 1, fact_key=f"item/{item}", time_ms=2, cause_id="x", step=1,
        item=item, segment=1000 + item, status="succeeded", output=b"2",
    )  # fmt: skip
    settled = reduce(state, fact)
    assert settled is not None
    return settled


def test_settling_an_item_does_not_copy_the_items_settled_before() -> None:
    """Folding the 20,001st item allocates a small fraction of what copying the 20,000
    before it would (a dict of 20,000 entries is ~600 KB)."""
    state = _fan_out_run(20_000)
    allocated, after = _allocated(lambda: _settle_last(state, 20_000))
    assert after.nodes[1].item_outputs[20_000] == b"2"
    assert len(after.nodes[1].item_outputs) == 20_001
    assert len(state.nodes[1].item_outputs) == 20_000  # the state folded from is unchanged
    assert allocated < 60_000, f"{allocated} bytes allocated to settle one item"


def test_a_run_row_stores_the_items_as_a_json_object_and_reads_them_back() -> None:
    items = 2 * CHUNK + 3  # in three chunks
    state = _settle_last(_fan_out_run(items), items)
    text = row_json(state)
    stored: dict[str, Any] = json.loads(text)
    ones = {str(item): "MQ==" for item in range(items)}  # b"1" in base64, as dicts were
    assert list(stored["nodes"]["1"]["item_outputs"].items()) == [
        *ones.items(),
        (str(items), "Mg=="),
    ]
    again = state_of(text)
    assert again == state
    assert isinstance(again.nodes[1].item_outputs, ChunkedMap)
    assert again.nodes[1].item_outputs == {**dict.fromkeys(range(items), b"1"), items: b"2"}


def _awaiting(interactions: int) -> RunState:
    """A run waiting at boundary 1 on ``interactions`` open items of an await."""
    opened = {
        f"b1/i{index}": Interaction(
            boundary=1, item_index=index, kind="await", target="t", deadline_ms=0, token_digest=b""
        )
        for index in range(interactions)
    }
    boundary = Boundary(number=1, itemized=True, items=interactions, total=interactions)
    return _run(interactions=opened, boundary=boundary)


def test_admitting_an_interaction_does_not_copy_the_others() -> None:
    """An await's (or child step's) item admitted at a boundary of 20,000 allocates a
    small fraction of what copying the other 19,999 would."""
    state = _awaiting(20_000)
    fact = BoundaryCompletionAdmitted(
        run_id="r", seq=state.version + 1, fact_key="admitted/b1/i7", time_ms=2, cause_id="x",
        boundary=1, interaction="b1/i7", item_index=7, source="completion", outcome="success",
        payload=b"1", content_type="application/json", payload_digest=b"d",
    )  # fmt: skip
    allocated, after = _allocated(lambda: reduce(state, fact))
    assert after is not None
    assert after.interactions["b1/i7"].status == "admitted"
    assert state.interactions["b1/i7"].status == "open"  # the state folded from is unchanged
    assert len(after.interactions) == 20_000
    assert allocated < 60_000, f"{allocated} bytes allocated to admit one item"
