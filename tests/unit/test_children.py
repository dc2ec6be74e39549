"""Child runs' pure parts: derived ids, the submit's checks, the outcome sent back, and
a stopping parent that waits for its children."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from processor.admission.admit import admit
from processor.admission.arrivals import Arrival, completion_arrival
from processor.clients.client import new_submit
from processor.facts.codec import encode
from processor.facts.keyring import KeyRing
from processor.facts.models import CancelRun, FactHeader, RunFailed, SegmentResult, SubmitRun
from processor.model.children import (
    CHILD_DEPTH_EXCEEDED,
    MAX_CHILD_DEPTH,
    child_run_id,
    submit_refusal,
)
from processor.model.decide import (
    Context,
    Decision,
    TimerFired,
    decide_result,
    decide_submit,
    decide_timer,
)
from processor.model.due import due_entries
from processor.model.operator import decide_cancel
from processor.model.parent_link import ParentLink, parent_completion
from processor.model.pipeline_spec import AwaitSpec, PipelineSpec, StepSpec
from processor.model.reduce import fold
from processor.model.state import RunState
from processor.worker.pipeline import Pipeline

small = st.integers(min_value=0, max_value=10_000)
UNIT_KEYS = KeyRing.single(b"unit-secret-0123456789abcdef")


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


# --- a stopping parent waits for its children (pure decisions, folded as the loop does) ---

PARENT = PipelineSpec(
    "parent", 1, (StepSpec("fan", awaits=AwaitSpec("kid", 1_000, itemized=True, kind="child")),)
)


KID = PipelineSpec("kid", 1, (StepSpec("touch"),))


class _Catalog:
    def latest(self, name: str) -> PipelineSpec | None:
        return {spec.name: spec for spec in (PARENT, KID)}.get(name)

    def get(self, name: str, version: int) -> PipelineSpec | None:
        return self.latest(name)


class _Parent:
    """A parent run suspended on two children, driven through pure decisions."""

    def __init__(self) -> None:
        self.now = 10_000
        self.facts: list[FactHeader] = []
        self.emits: list[object] = []
        command = new_submit("parent", [1, 2])
        self.run_id = command.run_id
        self.take(decide_submit(command, None, self.ctx))
        state = self.state
        result = SegmentResult(
            result_id="r1",
            run_id=self.run_id,
            segment=state.attempt.segment,
            attempt=state.attempt.number,
            generation=state.attempt.generation,
            steps=(),
            outcome="suspended",
            worker_id="w",
            requests=(b"1", b"2"),
        )
        self.take(decide_result(result, state, self.ctx))
        self.submits = [e for e in self.emits if isinstance(e, SubmitRun)]
        assert len(self.submits) == 2

    @property
    def ctx(self) -> Context:
        return Context(_Catalog(), self.now, UNIT_KEYS)

    @property
    def state(self) -> RunState:
        state = fold(self.facts)
        assert state is not None
        return state

    def take(self, decision: Decision) -> Decision:
        self.facts.extend(decision.facts)
        self.emits.extend(e.value for e in decision.emits)
        return decision

    def cancel(self) -> Decision:
        cancel = CancelRun(command_id="c", run_id=self.run_id, reason="test", requested_ms=self.now)
        return self.take(decide_cancel(cancel, self.state, self.ctx))

    def child_ends(self, item: int, status: str) -> Decision:
        submit = self.submits[item]
        link = ParentLink(run_id=self.run_id, token=submit.parent_token or "", depth=1)
        done = parent_completion(submit.run_id, link, status, None, "stopped")
        arrival = completion_arrival(encode(done), UNIT_KEYS, f"child-{item}")
        assert isinstance(arrival, Arrival)
        return self.take(admit(arrival, self.state, self.ctx))

    def fire_due(self) -> None:
        for entry in sorted(due_entries(self.state)):
            if entry.due_ms <= self.now:
                self.take(decide_timer(TimerFired(entry), self.state, self.ctx))


def _names(facts: Sequence[FactHeader]) -> list[str]:
    return [type(f).__name__ for f in facts]


def test_a_stopped_parent_ends_once_its_last_child_outcome_is_in() -> None:
    parent = _Parent()
    stopped = parent.cancel()
    cancels = [e for e in stopped.emits if isinstance(e.value, CancelRun)]
    assert {c.key for c in cancels} == {s.run_id for s in parent.submits}
    assert _names(stopped.facts) == ["RunStopRequested"]  # no unwind yet: children open
    assert parent.state.phase == "suspended" and not parent.state.terminal

    first = parent.child_ends(0, "cancelled")
    assert first.refusal is None and _names(first.facts) == ["BoundaryCompletionAdmitted"]
    assert not parent.state.terminal
    last = parent.child_ends(1, "succeeded")  # it finished before the cancel reached it
    assert last.refusal is None
    assert _names(last.facts)[0] == "BoundaryCompletionAdmitted"
    assert parent.state.terminal and parent.state.status == "cancelled"
    assert "SegmentAttemptStarted" not in _names(last.facts)  # nothing went on forward


def test_a_stopped_parent_stops_waiting_for_a_child_at_its_deadline() -> None:
    parent = _Parent()
    parent.cancel()
    parent.child_ends(0, "cancelled")
    parent.now += 1_000  # the child step's timeout: the open child's interaction ends
    parent.fire_due()
    assert "InteractionTimedOut" in _names(parent.facts)
    assert parent.state.terminal and parent.state.status == "cancelled"
    late = parent.child_ends(1, "cancelled")
    assert late.refusal == "run_terminal"


def test_a_parent_failed_by_a_child_cancels_its_other_children_and_waits_for_them() -> None:
    parent = _Parent()
    failed = parent.child_ends(0, "failed")  # no tolerance: the child step fails the parent
    cancels = [e for e in failed.emits if isinstance(e.value, CancelRun)]
    assert [c.key for c in cancels] == [parent.submits[1].run_id]  # the open one only
    # The step failed, and the run with it, once its other child is in: stop intent now.
    assert _names(failed.facts) == [
        "BoundaryCompletionAdmitted",
        "SegmentFailed",
        "RunStopRequested",
    ]
    assert parent.state.stopping and not parent.state.terminal
    assert {e.kind for e in due_entries(parent.state)} == {"interaction_timeout"}

    last = parent.child_ends(1, "cancelled")
    assert last.refusal is None
    assert _names(last.facts) == ["BoundaryCompletionAdmitted", "RunFailed"]
    ended = last.facts[-1]
    assert isinstance(ended, RunFailed)
    assert ended.error_type == "BoundaryFailure"  # the first child's failure, not the cancel
    assert ended.error.startswith("item 0: child run ") and ended.error.endswith("failed: stopped")
    assert parent.state.status == "failed"


def test_a_failed_parent_stops_waiting_for_a_child_at_its_deadline() -> None:
    parent = _Parent()
    parent.child_ends(0, "failed")
    parent.now += 1_000  # the child step's timeout: the cancelled child never answered
    parent.fire_due()
    assert _names(parent.facts)[-2:] == ["InteractionTimedOut", "RunFailed"]
    assert parent.state.status == "failed"
    assert parent.child_ends(1, "cancelled").refusal == "run_terminal"


def test_a_parent_failed_by_its_last_open_child_fails_at_once() -> None:
    parent = _Parent()
    parent.child_ends(1, "succeeded")
    failed = parent.child_ends(0, "failed")
    assert _names(failed.facts) == ["BoundaryCompletionAdmitted", "SegmentFailed", "RunFailed"]
    assert not [e for e in failed.emits if isinstance(e.value, CancelRun)]
