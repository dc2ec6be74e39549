"""Payload limits on both transports: a run input, a step output or a completion
over ``max_payload_bytes`` is refused with ``payload_too_large`` and kept whole;
one at the limit is accepted, and the processor goes on with the next run."""

from __future__ import annotations

from typing import Any

import pytest

from processor.clients.client import Client, new_submit
from processor.clients.external import CompletionClient
from processor.config.settings import Settings
from processor.facts import payload
from processor.facts.codec import encode
from processor.facts.models import (
    BoundaryCompletionAdmitted,
    CommandReply,
    RunFailed,
    SegmentFailed,
)
from processor.facts.topics import TopicName
from processor.worker.executor import execute
from tests.apps.support import LoopHarness, TopicTail, decode_records
from tests.boundaries.test_awaits import completion, run_until_suspended, status

LIMIT = 2048


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The transport's settings with a small payload limit."""
    return settings.model_copy(update={"max_payload_bytes": LIMIT})


def sized(size: int) -> dict[str, str]:
    """A run input of the scalar pipeline whose canonical JSON is exactly ``size`` bytes."""
    filler = size - len(payload.dumps({"n": ""}))
    value = {"n": "x" * filler}
    assert len(payload.dumps(value)) == size
    return value


def play_limited(h: LoopHarness, condition: Any, what: str) -> None:
    """Drive the loop, playing a worker held to the limit, until ``condition``."""

    def step() -> bool:
        for item in h.new_work():
            result = execute(item, h.app, "limited-worker", None, LIMIT)
            h.produce_model(TopicName.RESULTS, item.run_id, result)
        return bool(condition())

    h.drive(step, what)


def a_next_run_succeeds(h: LoopHarness) -> None:
    """The processor goes on: a small run suspends, is answered and succeeds."""
    run_id, (request,) = run_until_suspended(h, "scalar", {"n": 1})
    h.produce_model(TopicName.COMPLETIONS, run_id, completion(request, 2))
    play_limited(h, lambda: status(h, run_id) == "succeeded", "the next run to succeed")


def replies(h: LoopHarness, tail: TopicTail, command_id: str) -> list[CommandReply]:
    return [r for r in decode_records(tail.new(), CommandReply) if r.command_id == command_id]


def test_a_run_input_over_the_limit_is_refused_and_kept(harness: LoopHarness) -> None:
    h = harness
    tail = TopicTail(h.reader, h.name(TopicName.REPLIES), h.deployment.topology.partitions)
    command = new_submit("scalar", sized(LIMIT + 1))  # a producer that is not our client
    record = h.produce(TopicName.COMMANDS, command.run_id, encode(command))
    refusal = h.drive(lambda: h.rejected.find(record), "the rejection")
    assert refusal.reason == "payload_too_large"
    assert f"{LIMIT + 1} bytes" in refusal.detail and f"limit of {LIMIT} bytes" in refusal.detail
    assert refusal.original_value == record.value  # nothing is lost
    (reply,) = h.drive(lambda: replies(h, tail, command.command_id), "the reply")
    assert (reply.created, reply.refusal) == (False, "payload_too_large")
    assert h.loop_state(command.run_id) is None

    at_limit = h.submit("scalar", sized(LIMIT))
    h.drive(lambda: h.loop_state(at_limit) is not None, "the run at the limit")
    a_next_run_succeeds(h)


def test_the_client_refuses_an_oversized_input_before_producing(harness: LoopHarness) -> None:
    h = harness
    d = h.deployment
    tail = TopicTail(h.reader, h.name(TopicName.COMMANDS), d.topology.partitions)
    before = tail.end_total()
    client = Client(d.transport, d.topology, d.settings.state_dir, max_payload_bytes=LIMIT)
    try:
        with pytest.raises(payload.PayloadTooLarge, match=f"over the limit of {LIMIT} bytes"):
            client.submit("scalar", sized(LIMIT + 1), wait_s=0)
        with pytest.raises(ValueError, match=f"run input is {LIMIT * 4} bytes"):  # ValueError
            client.submit("scalar", sized(LIMIT * 4), wait_s=0)
    finally:
        client.close()
    assert tail.end_total() == before  # nothing produced


def test_a_step_output_over_the_limit_fails_the_run_not_retryably(harness: LoopHarness) -> None:
    h = harness
    # ``prepare`` adds a field to its input: an input at the limit makes an output over it.
    run_id = h.submit("scalar", sized(LIMIT))
    play_limited(h, lambda: status(h, run_id) == "failed", "the run to fail")
    failed = [f for f in h.facts(run_id) if isinstance(f, SegmentFailed)]
    assert len(failed) == 1 and not failed[0].retryable  # one attempt, not retried
    assert failed[0].error_type == "PayloadTooLarge"
    assert "output of step 'prepare'" in failed[0].error
    assert f"limit of {LIMIT} bytes" in failed[0].error
    size = len(payload.dumps({**sized(LIMIT), "prepared": True}))
    assert f"is {size} bytes" in failed[0].error  # the failure says its size
    assert any(isinstance(f, RunFailed) for f in h.facts(run_id))
    a_next_run_succeeds(h)


def test_a_completion_over_the_limit_is_refused_and_kept(harness: LoopHarness) -> None:
    h = harness
    run_id, (request,) = run_until_suspended(h, "scalar", {"n": 3})
    big = completion(request, "y" * LIMIT, key="too-big")  # a JSON string: LIMIT + 2 bytes
    record = h.produce_model(TopicName.COMPLETIONS, run_id, big)
    refusal = h.drive(lambda: h.rejected.find(record), "the rejection")
    assert refusal.reason == "payload_too_large"
    assert f"completion payload is {LIMIT + 2} bytes" in refusal.detail
    assert refusal.original_value == record.value and refusal.run_id == run_id
    assert h.suspended(run_id)  # the run still waits for its answer

    at_limit = completion(request, "z" * (LIMIT - 2), key="at-limit")
    h.produce_model(TopicName.COMPLETIONS, run_id, at_limit)

    def admitted() -> bool:
        return any(isinstance(f, BoundaryCompletionAdmitted) for f in h.facts(run_id))

    h.drive(admitted, "the completion at the limit admitted")
    assert h.rejected.find(record) is not None and len(h.rejected.seen) == 1
    a_next_run_succeeds(h)


def test_the_completion_client_refuses_an_oversized_payload_first(harness: LoopHarness) -> None:
    h = harness
    run_id, (request,) = run_until_suspended(h, "scalar", {"n": 4})
    d = h.deployment
    tail = TopicTail(h.reader, h.name(TopicName.COMPLETIONS), d.topology.partitions)
    before = tail.end_total()
    client = CompletionClient(d.transport, d.topology, max_payload_bytes=LIMIT)
    try:
        with pytest.raises(payload.PayloadTooLarge, match="completion payload"):
            client.complete(request.resume_token, "y" * LIMIT)
        assert tail.end_total() == before  # nothing produced
        client.complete(request.resume_token, "z" * (LIMIT - 2))
    finally:
        client.close()
    play_limited(h, lambda: status(h, run_id) == "failed", "the run to go on")
    # ``finish`` wraps the answer, so its output is over the limit: the run fails clearly.
    failed = [f for f in h.facts(run_id) if isinstance(f, SegmentFailed)]
    assert [f.error_type for f in failed] == ["PayloadTooLarge"]
    (admitted,) = [f for f in h.facts(run_id) if isinstance(f, BoundaryCompletionAdmitted)]
    assert len(admitted.payload) == LIMIT  # admitted whole
