"""Child runs' pure parts: derived ids, the submit's checks, the outcome sent back."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from processor.facts.models import SubmitRun
from processor.model.children import (
    CHILD_DEPTH_EXCEEDED,
    MAX_CHILD_DEPTH,
    child_run_id,
    submit_refusal,
)
from processor.model.parent_link import ParentLink, parent_completion
from processor.worker.pipeline import Pipeline

small = st.integers(min_value=0, max_value=10_000)


@given(st.text(min_size=1, max_size=30), small, small)
def test_a_child_id_is_a_function_of_parent_boundary_and_item(
    parent: str, boundary: int, item: int
) -> None:
    child = child_run_id(parent, boundary, item)
    assert child == child_run_id(parent, boundary, item)
    assert str(uuid.UUID(child)) == child  # shaped like the run ids clients make
    others = {
        child_run_id(parent + "x", boundary, item),
        child_run_id(parent, boundary + 1, item),
        child_run_id(parent, boundary, item + 1),
    }
    assert child not in others and len(others) == 3


def _submit(**fields: object) -> SubmitRun:
    base: dict[str, object] = {
        "command_id": "c",
        "run_id": "r",
        "pipeline": "p",
        "input": b"1",
        "submitted_ms": 1,
    }
    return SubmitRun.model_validate({**base, **fields})


def test_a_submit_deeper_than_the_limit_is_refused() -> None:
    deep = _submit(parent_run_id="p", parent_token="t", depth=MAX_CHILD_DEPTH + 1)
    refusal = submit_refusal(deep)
    assert refusal is not None and refusal[0] == CHILD_DEPTH_EXCEEDED
    assert (
        submit_refusal(_submit(parent_run_id="p", parent_token="t", depth=MAX_CHILD_DEPTH)) is None
    )
    assert submit_refusal(_submit()) is None


def test_a_child_names_its_parent_and_the_token_together() -> None:
    refusal = submit_refusal(_submit(parent_run_id="p", depth=1))
    assert refusal is not None and refusal[0] == "invalid_command"


def test_the_outcome_a_child_sends_its_parent() -> None:
    link = ParentLink(run_id="parent", token="tok", depth=1)
    done = parent_completion("kid", link, "succeeded", b'{"x":1}', None)
    assert (done.token, done.outcome, done.payload, done.idempotency_key) == (
        "tok",
        "success",
        b'{"x":1}',
        "child/kid",
    )
    failed = parent_completion("kid", link, "cancelled", None, "stopped")
    assert (failed.outcome, failed.error) == ("failure", "child run kid cancelled: stopped")
    timed_out = parent_completion("kid", link, "timed_out", None, None)
    assert timed_out.error == "child run kid timed_out"


def test_a_child_step_is_an_await_of_kind_child() -> None:
    pipeline = Pipeline("p")

    @pipeline.child("kid", timeout_s=5, itemized=True, max_in_flight=2)
    def fan(value: object) -> object:
        return value

    awaits = pipeline.steps[0].spec.awaits
    assert awaits is not None
    assert (awaits.kind, awaits.target, awaits.timeout_ms, awaits.max_in_flight) == (
        "child",
        "kid",
        5000,
        2,
    )
    assert pipeline.steps[0].function is fan
