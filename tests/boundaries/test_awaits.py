"""Awaits end to end: suspension, admission, continuation, timeouts, handoffs, publication."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

from processor.facts import handoff_signature, tokens
from processor.facts.models import (
    BoundaryCompletion,
    BoundaryCompletionAdmitted,
    BoundaryRequest,
    ContinuationSegmentCreated,
    InteractionTimedOut,
    TerminalPublicationCompleted,
)
from processor.facts.topics import TopicName
from processor.model.continuation import TIMED_OUT
from processor.transport.base import Record
from tests.apps.boundary_pipelines import AWAIT_TIMEOUT_S, PUBLISHED_TOPIC
from tests.apps.support import LoopHarness, TopicTail, decode_records, wait_until
from tests.control.control_support import timers_held

AWAIT_MS = int(AWAIT_TIMEOUT_S * 1000)


def completion(
    request: BoundaryRequest, value: Any, *, key: str | None = None
) -> BoundaryCompletion:
    return BoundaryCompletion(
        token=request.resume_token,
        idempotency_key=key or f"k-{request.interaction}",
        outcome="success",
        payload=json.dumps(value).encode(),
    )


def status(h: LoopHarness, run_id: str) -> str:
    state = h.loop_state(run_id)
    return "" if state is None else state.status


def play(h: LoopHarness, condition: Callable[[], bool], what: str) -> None:
    """Drive the loop, playing the worker for every dispatched item, until ``condition``."""

    def step() -> bool:
        for item in h.new_work():
            h.complete(item)
        return condition()

    h.drive(step, what)


def run_until_suspended(
    h: LoopHarness, pipeline: str, value: Any
) -> tuple[str, list[BoundaryRequest]]:
    """Submit, play the worker until the run waits at a boundary; return its requests."""
    requests = TopicTail(h.reader, h.name(TopicName.REQUESTS), h.deployment.topology.partitions)
    run_id = h.submit(pipeline, value)
    play(h, lambda: h.suspended(run_id), "suspension")
    found = [r for r in decode_records(requests.new(), BoundaryRequest) if r.run_id == run_id]
    return run_id, sorted(found, key=lambda r: r.item_index)


def finish(h: LoopHarness, run_id: str) -> None:
    """Play the worker until the run is terminal."""
    play(h, lambda: status(h, run_id) in ("succeeded", "failed"), "terminal")


def test_scalar_await_suspends_admits_and_continues_with_the_payload(harness: LoopHarness) -> None:
    h = harness
    run_id, requests = run_until_suspended(h, "scalar", {"n": 7})
    assert len(requests) == 1
    (request,) = requests
    assert json.loads(request.request) == {"question": 7}
    assert (
        request.deadline_ms == h.clock() + AWAIT_MS or request.deadline_ms <= h.clock() + AWAIT_MS
    )
    assert tokens.parse(request.resume_token) is not None
    assert h.fact_types(run_id)[-4:] == [
        "StepCompleted",
        "SegmentSuspended",
        "BoundaryInteractionDispatched",
        "BoundaryDispatchCompleted",
    ]
    h.produce_model(TopicName.COMPLETIONS, run_id, completion(request, {"answer": 42}))
    finish(h, run_id)
    state = h.loop_state(run_id)
    assert state is not None and state.status == "succeeded"
    assert json.loads(state.result or b"") == {"answer": {"answer": 42}}
    types = h.fact_types(run_id)
    admitted = types.index("BoundaryCompletionAdmitted")
    assert types[admitted + 1 : admitted + 4] == [
        "StepCompleted",
        "ContinuationSegmentCreated",
        "SegmentAttemptStarted",
    ]


def test_itemized_await_of_1000_items_releases_once_in_index_order(harness: LoopHarness) -> None:
    h = harness
    run_id, requests = run_until_suspended(h, "itemized", {"items": 1000})
    assert [r.item_index for r in requests] == list(range(1000))
    shuffled = requests[:]
    random.Random(7).shuffle(shuffled)
    for index, request in enumerate(shuffled):
        item = json.loads(request.request)["i"]
        h.produce_model(
            TopicName.COMPLETIONS, run_id, completion(request, item * item), flush=False
        )
        if index % 250 == 249:
            h.producer.flush()
            h.loop.run_once()
    h.producer.flush()
    finish(h, run_id)
    facts = h.facts(run_id)
    assert sum(isinstance(f, BoundaryCompletionAdmitted) for f in facts) == 1000
    released = [f for f in facts if isinstance(f, ContinuationSegmentCreated)]
    assert len(released) == 1
    assert json.loads(released[0].input) == [i * i for i in range(1000)]
    state = h.loop_state(run_id)
    assert state is not None and json.loads(state.result or b"") == {
        "outputs": [i * i for i in range(1000)]
    }


def test_itemized_await_of_no_items_continues_at_once(harness: LoopHarness) -> None:
    h = harness
    requests = TopicTail(h.reader, h.name(TopicName.REQUESTS), h.deployment.topology.partitions)
    run_id = h.submit("itemized", {"items": 0})
    finish(h, run_id)
    assert requests.new() == []
    types = h.fact_types(run_id)
    assert types.index("BoundaryDispatchCompleted") + 2 == types.index("ContinuationSegmentCreated")
    state = h.loop_state(run_id)
    assert state is not None and json.loads(state.result or b"") == {"outputs": []}


def test_a_failure_completion_fails_the_run(harness: LoopHarness) -> None:
    h = harness
    run_id, (request,) = run_until_suspended(h, "scalar", {"n": 1})
    failure = BoundaryCompletion(
        token=request.resume_token, idempotency_key="f", outcome="failure", error="card declined"
    )
    h.produce_model(TopicName.COMPLETIONS, run_id, failure)
    h.drive(lambda: status(h, run_id) == "failed", "run failed")
    state = h.loop_state(run_id)
    assert state is not None and "card declined" in (state.error or "")


def test_timeout_fails_the_run_or_continues_as_the_step_chose(harness: LoopHarness) -> None:
    h = harness
    failing, _ = run_until_suspended(h, "scalar", {"n": 1})
    tolerant, (request,) = run_until_suspended(h, "tolerant", "hello")
    h.clock.advance_to(request.deadline_ms)
    h.drive(lambda: status(h, failing) == "failed", "scalar await timed out")
    finish(h, tolerant)
    tolerant_state = h.loop_state(tolerant)
    assert tolerant_state is not None and tolerant_state.status == "succeeded"
    assert json.loads(tolerant_state.result or b"") == {"handled": TIMED_OUT}
    assert any(isinstance(f, InteractionTimedOut) for f in h.facts(failing))


def test_completion_before_the_deadline_wins(harness: LoopHarness) -> None:
    h = harness
    run_id, (request,) = run_until_suspended(h, "scalar", {"n": 3})
    h.clock.advance_to(request.deadline_ms - 1)
    h.produce_model(TopicName.COMPLETIONS, run_id, completion(request, "in time"))
    h.drive(
        lambda: any(isinstance(f, BoundaryCompletionAdmitted) for f in h.facts(run_id)), "admitted"
    )
    h.clock.advance_to(request.deadline_ms + 1)
    finish(h, run_id)
    assert not any(isinstance(f, InteractionTimedOut) for f in h.facts(run_id))
    assert status(h, run_id) == "succeeded"


def test_completion_at_the_deadline_loses_when_processed_first(harness: LoopHarness) -> None:
    h = harness
    run_id, (request,) = run_until_suspended(h, "scalar", {"n": 4})
    h.clock.advance_to(request.deadline_ms)
    with timers_held(h):  # the completion is decided before the (due) timer is scanned
        record = h.produce_model(TopicName.COMPLETIONS, run_id, completion(request, "too late"))
        rejected = h.drive(lambda: h.rejected.find(record), "refusal")
    assert rejected.reason == "late_completion"
    facts = h.facts(run_id)
    assert not any(isinstance(f, BoundaryCompletionAdmitted) for f in facts)
    assert sum(isinstance(f, InteractionTimedOut) for f in facts) == 1
    h.drive(lambda: status(h, run_id) == "failed", "run failed by the timeout")
    assert sum(isinstance(f, InteractionTimedOut) for f in h.facts(run_id)) == 1


def test_completion_at_the_deadline_loses_when_the_timer_fired_first(harness: LoopHarness) -> None:
    h = harness
    run_id, (request,) = run_until_suspended(h, "scalar", {"n": 5})
    h.clock.advance_to(request.deadline_ms)
    h.drive(lambda: any(isinstance(f, InteractionTimedOut) for f in h.facts(run_id)), "timeout")
    record = h.produce_model(TopicName.COMPLETIONS, run_id, completion(request, "too late"))
    rejected = h.drive(lambda: h.rejected.find(record), "refusal")
    assert rejected.reason in ("late_completion", "run_terminal")
    assert not any(isinstance(f, BoundaryCompletionAdmitted) for f in h.facts(run_id))


def test_checkpoint_handoff_starts_the_target_pipeline(harness: LoopHarness) -> None:
    h = harness
    source_run = h.submit("source", {"order": "o-9"})
    play(h, lambda: status(h, source_run) == "succeeded", "source succeeded")
    source_facts = h.facts(source_run)
    assert [type(f).__name__ for f in source_facts][-3:] == [
        "TerminalPublicationPrepared",
        "TerminalPublicationCompleted",
        "RunSucceeded",
    ]
    from processor.facts.payload import derive_run_id

    sink_run = derive_run_id(f"{source_run}/checkpoint/order-ready")
    play(h, lambda: status(h, sink_run) == "succeeded", "sink succeeded")
    sink_facts = h.facts(sink_run)
    admitted = [f for f in sink_facts if isinstance(f, BoundaryCompletionAdmitted)]
    assert len(admitted) == 1 and admitted[0].source == "checkpoint"
    state = h.loop_state(sink_run)
    assert state is not None and state.pipeline == "sink"
    assert json.loads(state.result or b"") == {"received": {"order": "o-9", "ready": True}}


def test_a_waiting_run_continues_with_a_checkpoint_handoff(harness: LoopHarness) -> None:
    from processor.facts.models import CheckpointHandoff

    h = harness
    run_id, requests = run_until_suspended(h, "waiter", 1)
    assert requests == []  # a checkpoint await asks no external system
    handoff = CheckpointHandoff(
        source_run_id="upstream-1",
        checkpoint="go",
        target=f"run:{run_id}",
        idempotency_key="upstream-1/checkpoint/go",
        payload=b'{"go": true}',
    )
    handoff = handoff_signature.signed(h.keys, handoff)
    h.produce_model(TopicName.CHECKPOINTS, run_id, handoff)
    h.produce_model(TopicName.CHECKPOINTS, run_id, handoff)  # a duplicate: no-op
    finish(h, run_id)
    state = h.loop_state(run_id)
    assert state is not None and json.loads(state.result or b"") == {"proceeded_with": {"go": True}}
    admitted = [f for f in h.facts(run_id) if isinstance(f, BoundaryCompletionAdmitted)]
    assert len(admitted) == 1 and admitted[0].source == "checkpoint"


def test_terminal_publication_publishes_before_success(harness: LoopHarness) -> None:
    h = harness
    # Every partition of the topic as it is: on a shared broker another test may have
    # made it first, with more partitions than this deployment's.
    admin = h.deployment.transport.admin()
    partitions = admin.describe_topics()[PUBLISHED_TOPIC].partitions
    admin.close()
    published = TopicTail(h.reader, PUBLISHED_TOPIC, partitions)
    run_id = h.submit("publisher", "hello")
    finish(h, run_id)
    # On Kafka a committed transaction's records become readable (read_committed) once
    # its markers are written, which the broker does after the commit returns.
    records: list[Record] = []

    def published_now() -> bool:
        records.extend(r for r in published.new() if r.key == run_id.encode())
        return bool(records)

    wait_until(published_now, 10, "the publication")
    published_now()  # and nothing more
    assert len(records) == 1
    assert json.loads(records[0].value or b"") == {"published": "hello"}
    assert dict(records[0].headers)["idempotency-key"] == f"{run_id}/terminal".encode()
    completed = [f for f in h.facts(run_id) if isinstance(f, TerminalPublicationCompleted)]
    assert len(completed) == 1
