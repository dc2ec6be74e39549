"""The admission stage and continuation planner, pure: every refusal reason, every race."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.admission.admit import admit
from processor.admission.arrivals import Arrival, Refusal, completion_arrival, handoff_arrival
from processor.clients.client import new_submit
from processor.facts import handoff_signature, tokens
from processor.facts.codec import encode
from processor.facts.keyring import KeyRing
from processor.facts.models import (
    BoundaryCompletion,
    BoundaryRequest,
    CheckpointHandoff,
    FactHeader,
    SegmentResult,
    StepOutput,
)
from processor.facts.topics import TopicName
from processor.model.decide import (
    Context,
    Decision,
    TimerFired,
    decide_result,
    decide_submit,
    decide_timer,
)
from processor.model.due import due_entries
from processor.model.pipeline_spec import AwaitSpec, PipelineSpec, StepSpec
from processor.model.reduce import fold
from processor.model.schedules import fire_run_id
from processor.model.state import RunState

KEYS = KeyRing.single(b"unit-secret-0123456789abcdef")
TIMEOUT = 1_000
AWAITING = PipelineSpec(
    "awaiting",
    1,
    (
        StepSpec("a"),
        StepSpec("b", awaits=AwaitSpec("svc", TIMEOUT)),
        StepSpec("c"),
    ),
)
FANOUT = PipelineSpec(
    "fanout", 1, (StepSpec("f", awaits=AwaitSpec("svc", TIMEOUT, itemized=True)), StepSpec("g"))
)


class Catalog:
    specs: ClassVar[dict[str, PipelineSpec]] = {s.name: s for s in (AWAITING, FANOUT)}

    def latest(self, name: str) -> PipelineSpec | None:
        return self.specs.get(name)

    def get(self, name: str, version: int) -> PipelineSpec | None:
        return self.specs.get(name)


class World:
    """One run driven through pure decisions, its facts folded as the loop would."""

    def __init__(self, pipeline: str = "awaiting", items: int = 1) -> None:
        self.now = 10_000
        self.facts: list[FactHeader] = []
        self.requests: list[BoundaryRequest] = []
        command = new_submit(pipeline, {"x": 1})
        self.run_id = command.run_id
        self.take(decide_submit(command, None, self.ctx))
        state = self.state
        assert state is not None
        done = () if pipeline == "fanout" else (StepOutput(step=0, output=b'{"a":1}'),)
        requests = tuple(json.dumps({"i": i}).encode() for i in range(items))
        result = SegmentResult(
            result_id="r1",
            run_id=self.run_id,
            segment=state.attempt.segment,
            attempt=state.attempt.number,
            generation=state.attempt.generation,
            steps=done,
            outcome="suspended",
            worker_id="w",
            requests=requests,
        )
        self.take(decide_result(result, state, self.ctx))

    @property
    def ctx(self) -> Context:
        return Context(Catalog(), self.now, KEYS)

    @property
    def state(self) -> RunState | None:
        return fold(self.facts)

    def take(self, decision: Decision) -> Decision:
        self.facts.extend(decision.facts)
        self.requests.extend(
            e.value for e in decision.emits if isinstance(e.value, BoundaryRequest)
        )
        return decision

    def arrival(
        self,
        request: BoundaryRequest,
        value: object,
        *,
        token: str | None = None,
        outcome: str = "success",
    ) -> Arrival | Refusal:
        completion = BoundaryCompletion(
            token=token or request.resume_token,
            idempotency_key="k",
            outcome="success" if outcome == "success" else "failure",
            payload=json.dumps(value).encode() if outcome == "success" else b"",
            error=None if outcome == "success" else "declined",
        )
        return completion_arrival(encode(completion), KEYS, f"c{len(self.facts)}")

    def admit(self, request: BoundaryRequest, value: object, **kwargs: object) -> Decision:
        arrival = self.arrival(request, value, **kwargs)  # type: ignore[arg-type]
        if isinstance(arrival, Refusal):
            return Decision.refuse(arrival.reason, arrival.detail)
        return self.take(admit(arrival, self.state, self.ctx))

    def fire_due(self) -> None:
        for entry in sorted(due_entries(self.state)):
            if entry.due_ms <= self.now:
                self.take(decide_timer(TimerFired(entry), self.state, self.ctx))


def types(facts: tuple[FactHeader, ...] | list[FactHeader]) -> list[str]:
    return [type(f).__name__ for f in facts]


def test_suspension_records_the_boundary_and_requests_with_signed_tokens() -> None:
    world = World()
    assert types(world.facts)[-4:] == [
        "StepCompleted",
        "SegmentSuspended",
        "BoundaryInteractionDispatched",
        "BoundaryDispatchCompleted",
    ]
    (request,) = world.requests
    claims = tokens.verify(KEYS, request.resume_token)
    assert claims is not None and claims.run_id == world.run_id
    state = world.state
    assert state is not None and state.phase == "suspended"
    assert state.interactions[request.interaction].token_digest == tokens.digest(
        request.resume_token
    )
    assert request.resume_token.encode() not in b"".join(encode(f) for f in world.facts)


def test_an_admitted_completion_releases_the_scalar_continuation() -> None:
    world = World()
    decision = world.admit(world.requests[0], {"paid": True})
    assert decision.refusal is None
    assert types(decision.facts) == [
        "BoundaryCompletionAdmitted",
        "StepCompleted",
        "ContinuationSegmentCreated",
        "SegmentAttemptStarted",
    ]
    work = [e.value for e in decision.emits if e.topic is TopicName.WORK]
    assert len(work) == 1 and json.loads(work[0].input) == {"paid": True}  # type: ignore[attr-defined]


def test_an_identical_duplicate_is_a_no_op_and_a_different_payload_conflicts() -> None:
    world = World()
    world.admit(world.requests[0], {"paid": True})
    duplicate = world.admit(world.requests[0], {"paid": True})
    assert duplicate.facts == () and duplicate.refusal is None
    conflict = world.admit(world.requests[0], {"paid": False})
    assert conflict.refusal == "conflicting_completion" and conflict.facts == ()


def test_unknown_run_and_unknown_interaction_are_refused() -> None:
    world = World()
    other_claims = tokens.TokenClaims(world.run_id, 9, "b9.0", 1)
    forged_interaction = tokens.sign(KEYS, other_claims)
    refused = world.admit(world.requests[0], 1, token=forged_interaction)
    assert refused.refusal == "unknown_interaction"
    arrival = world.arrival(world.requests[0], 1)
    assert isinstance(arrival, Arrival)
    assert admit(arrival, None, world.ctx).refusal == "unknown_interaction"


def test_a_completion_for_a_terminal_run_is_refused() -> None:
    world = World(pipeline="fanout", items=2)
    first, second = world.requests
    world.admit(first, 1, outcome="failure")  # fails the parent
    assert world.state is not None and world.state.status == "failed"
    assert world.admit(second, 2).refusal == "run_terminal"


def test_malformed_payloads_and_content_types_are_refused() -> None:
    world = World()
    request = world.requests[0]
    bad_json = BoundaryCompletion(
        token=request.resume_token, idempotency_key="k", outcome="success", payload=b"{nope"
    )
    refusal = completion_arrival(encode(bad_json), KEYS, "c")
    assert isinstance(refusal, Refusal) and refusal.reason == "malformed"
    xml = bad_json.model_copy(update={"payload": b"<a/>", "content_type": "text/xml"})
    refusal = completion_arrival(encode(xml), KEYS, "c")
    assert isinstance(refusal, Refusal) and refusal.reason == "malformed"


@given(st.data())
def test_any_altered_token_is_refused_and_never_admitted(data: st.DataObject) -> None:
    world = World()
    token = world.requests[0].resume_token
    index = data.draw(st.integers(0, len(token) - 1))
    replacement = data.draw(
        st.sampled_from("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.=")
    )
    altered = token[:index] + replacement + token[index + 1 :]
    if altered == token:
        return
    decision = world.admit(world.requests[0], 1, token=altered)
    assert decision.refusal in ("invalid_token", "unknown_interaction")
    assert decision.facts == ()


def test_tokens_for_another_run_or_signed_with_another_secret_are_refused() -> None:
    world, other = World(), World()
    claims = tokens.parse(world.requests[0].resume_token)
    assert claims is not None
    elsewhere = tokens.TokenClaims(other.run_id, claims.boundary, claims.interaction, claims.epoch)
    # the other run's claims with this run's signature: the MAC no longer matches
    body_of_other = tokens.sign(KEYS, elsewhere).rsplit(".", 1)[0]
    spliced = body_of_other + "." + world.requests[0].resume_token.rsplit(".", 1)[1]
    assert other.admit(other.requests[0], 1, token=spliced).refusal == "invalid_token"
    foreign = tokens.sign(KeyRing.single(b"another-secret-entirely-0000"), claims)
    assert world.admit(world.requests[0], 1, token=foreign).refusal == "invalid_token"
    stale_epoch = tokens.sign(
        KEYS, tokens.TokenClaims(claims.run_id, claims.boundary, claims.interaction, 7)
    )
    assert world.admit(world.requests[0], 1, token=stale_epoch).refusal == "invalid_token"
    assert world.state is not None and world.state.phase == "suspended"


def test_at_the_deadline_a_completion_processed_first_loses_to_the_timeout() -> None:
    world = World()
    request = world.requests[0]
    world.now = request.deadline_ms
    decision = world.admit(request, {"late": True})
    assert decision.refusal == "late_completion"
    assert types(decision.facts) == ["InteractionTimedOut", "SegmentFailed", "RunFailed"]
    world.fire_due()  # the timer, processed second, finds nothing left to do
    assert types(world.facts).count("InteractionTimedOut") == 1


def test_at_the_deadline_a_timer_processed_first_wins_too() -> None:
    world = World()
    request = world.requests[0]
    world.now = request.deadline_ms
    world.fire_due()
    assert types(world.facts)[-3:] == ["InteractionTimedOut", "SegmentFailed", "RunFailed"]
    assert world.admit(request, {"late": True}).refusal in ("late_completion", "run_terminal")
    assert "BoundaryCompletionAdmitted" not in types(world.facts)


def test_just_before_the_deadline_the_completion_wins() -> None:
    world = World()
    request = world.requests[0]
    world.now = request.deadline_ms - 1
    assert world.admit(request, {"ok": 1}).refusal is None
    world.now = request.deadline_ms + 5
    world.fire_due()
    assert "InteractionTimedOut" not in types(world.facts)


@given(st.permutations(list(range(6))), st.lists(st.integers(0, 5), max_size=10))
def test_itemized_outputs_are_in_index_order_and_released_once(
    order: list[int], repeats: list[int]
) -> None:
    world = World(pipeline="fanout", items=6)
    for index in [*order, *repeats]:
        world.admit(world.requests[index], {"item": index})
    released = [f for f in world.facts if type(f).__name__ == "ContinuationSegmentCreated"]
    assert len(released) == 1
    assert json.loads(released[0].input) == [{"item": i} for i in range(6)]  # type: ignore[attr-defined]


def test_a_handoff_to_a_pipeline_starts_a_run_with_the_same_fact_shape() -> None:
    handoff = CheckpointHandoff(
        source_run_id="src",
        checkpoint="ready",
        target="pipeline:awaiting",
        idempotency_key="src/ready",
        payload=b'{"o":1}',
    )
    arrival = handoff_arrival(encode(handoff_signature.signed(KEYS, handoff)), KEYS, "c1")
    assert isinstance(arrival, Arrival) and arrival.source == "checkpoint"
    ctx = Context(Catalog(), 5, KEYS)
    decision = admit(arrival, None, ctx)
    assert "BoundaryCompletionAdmitted" in types(decision.facts)
    state = fold(list(decision.facts))
    assert state is not None and state.pipeline == "awaiting" and state.phase == "dispatched"
    assert admit(arrival, state, ctx).facts == ()  # the same handoff again: a no-op
    changed = handoff.model_copy(update={"payload": b"2"})
    other = handoff_arrival(encode(handoff_signature.signed(KEYS, changed)), KEYS, "c2")
    assert isinstance(other, Arrival)
    assert admit(other, state, ctx).refusal == "conflicting_completion"


@pytest.mark.parametrize("target", ["nowhere", "pipeline:", "run:"])
def test_a_handoff_with_a_bad_target_is_malformed(target: str) -> None:
    handoff = CheckpointHandoff(
        source_run_id="s", checkpoint="c", target=target, idempotency_key="k", payload=b"1"
    )
    refusal = handoff_arrival(encode(handoff_signature.signed(KEYS, handoff)), KEYS, "c")
    assert isinstance(refusal, Refusal) and refusal.reason == "malformed"


def test_a_scheduled_submit_records_its_schedule_if_its_run_id_is_that_fire_times() -> None:
    ctx = Context(Catalog(), 5, KEYS)
    fired = new_submit("awaiting", {"x": 1}).model_copy(
        update={
            "run_id": fire_run_id("nightly", 60_000),
            "schedule_id": "nightly",
            "fire_ms": 60_000,
        }
    )
    decision = decide_submit(fired, None, ctx)
    assert decision.refusal is None
    assert types(decision.facts)[:2] == ["RunSubmitted", "ScheduledRunLinked"]
    state = fold(list(decision.facts))
    assert state is not None and state.schedule is not None
    assert (state.schedule.schedule_id, state.schedule.fire_ms) == ("nightly", 60_000)
    # A label that is not the run's own: refused, not shown.
    forged = fired.model_copy(update={"run_id": fire_run_id("nightly", 120_000)})
    assert decide_submit(forged, None, ctx).refusal == "invalid_command"
    half = fired.model_copy(update={"fire_ms": None})
    assert decide_submit(half, None, ctx).refusal == "invalid_command"
