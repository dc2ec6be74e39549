"""Poison input on every input topic is refused and kept; the loop never stops.

A valid JSON number of 5,000 digits, or JSON nested 100,000 levels deep, once
stopped the processor for good (the record was read again after each restart).
Each such payload must now be refused with a reason, kept in admission.rejected
with its bytes, and the processor must go on with the next run. On both transports.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from processor.clients.client import new_submit
from processor.engine.loop import ProcessorLoop
from processor.facts import handoff_signature
from processor.facts.codec import encode
from processor.facts.models import (
    BoundaryCompletion,
    CheckpointHandoff,
    ResolveAttempt,
    StepOutput,
)
from processor.facts.topics import TopicName
from processor.transport.base import Record
from processor.worker.executor import execute
from tests.apps.support import LoopHarness
from tests.boundaries.test_awaits import finish, play, run_until_suspended, status

POISONS = {
    "digits": b"1" * 5000,
    "depth": b"[" * 100_000 + b"]" * 100_000,
}


def _refused(h: LoopHarness, source: Record, reason: str, what: str) -> None:
    """Drive the loop until ``source`` is in admission.rejected with ``reason`` and its bytes."""
    rejected = h.drive(lambda: h.rejected.find(source), f"the refusal of {what}")
    assert rejected.reason == reason, (what, rejected.detail)
    assert rejected.original_value == source.value
    assert rejected.original_key == source.key
    assert (rejected.source_topic, rejected.source_offset) == (source.topic, source.offset)


def _good_run_still_succeeds(h: LoopHarness) -> None:
    run_id = h.submit("scalar", {"n": 3})
    play(h, lambda: h.suspended(run_id), "the good run's suspension")


@pytest.mark.parametrize("poison", sorted(POISONS))
def test_poison_json_on_every_input_topic_is_refused_and_the_loop_goes_on(
    harness: LoopHarness, poison: str
) -> None:
    h, raw = harness, POISONS[poison]

    # runs.commands: a run input, and a resolve --succeed output.
    submit = new_submit("scalar", None).model_copy(update={"input": raw})
    _refused(
        h,
        h.produce(TopicName.COMMANDS, submit.run_id, encode(submit)),
        "invalid_input",
        "run input",
    )
    resolve = ResolveAttempt(
        command_id=str(uuid.uuid4()),
        run_id=str(uuid.uuid4()),
        segment=1,
        attempt=1,
        generation=1,
        idempotency_key="k",
        action="succeed",
        output=raw,
    )
    source = h.produce_model(TopicName.COMMANDS, resolve.run_id, resolve)
    _refused(h, source, "invalid_request", "resolve")

    # boundary.completions: a completion with the real token of a waiting run.
    run_id, (request,) = run_until_suspended(h, "scalar", {"n": 7})
    completion = BoundaryCompletion(
        token=request.resume_token, idempotency_key="poison", outcome="success", payload=raw
    )
    _refused(
        h, h.produce_model(TopicName.COMPLETIONS, run_id, completion), "malformed", "completion"
    )

    # boundary.checkpoints: a (signed) handoff that would start a pipeline.
    handoff = CheckpointHandoff(
        source_run_id="upstream",
        checkpoint="order-ready",
        target="pipeline:sink",
        idempotency_key=f"upstream/{uuid.uuid4()}",
        payload=raw,
    )
    handoff = handoff_signature.signed(h.keys, handoff)
    _refused(h, h.produce_model(TopicName.CHECKPOINTS, run_id, handoff), "malformed", "handoff")

    # segments.results: the current attempt's result with a poison step output.
    other = h.submit("scalar", {"n": 1})
    (item,) = h.drive(h.new_work, "the other run's work item")
    result = execute(item, h.app, "test-worker")
    forged = result.model_copy(
        update={"steps": (StepOutput(step=result.steps[0].step, output=raw),)}
    )
    _refused(h, h.produce_model(TopicName.RESULTS, other, forged), "malformed_result", "result")
    asking = result.model_copy(update={"requests": (raw,)})  # an await step's request
    _refused(h, h.produce_model(TopicName.RESULTS, other, asking), "malformed_result", "request")

    # Nothing stopped: the waiting run takes a good completion, and new runs go through.
    good = completion.model_copy(update={"idempotency_key": "good", "payload": b'{"answer": 1}'})
    h.produce_model(TopicName.COMPLETIONS, run_id, good)
    finish(h, run_id)
    assert status(h, run_id) == "succeeded"
    _good_run_still_succeeds(h)


def test_an_input_whose_decision_raises_is_refused_as_internal_error(
    harness: LoopHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The catch-all: whatever raises while an input is decoded or decided (a bug), on
    any input topic, refuses that input with the exception text, and only that input."""
    h = harness
    original = ProcessorLoop._decide

    def failing(self: ProcessorLoop, topic: TopicName, record: Record, *args: Any) -> Any:
        if record.key == b"poison":
            raise RuntimeError(f"boom on {record.topic}")
        return original(self, topic, record, *args)

    monkeypatch.setattr(ProcessorLoop, "_decide", failing)
    for topic in (
        TopicName.COMMANDS,
        TopicName.RESULTS,
        TopicName.COMPLETIONS,
        TopicName.CHECKPOINTS,
    ):
        value = f"anything for {topic.value}".encode()
        source = h.produce(topic, "poison", value)
        rejected = h.drive(lambda s=source: h.rejected.find(s), f"the refusal on {topic}")
        assert rejected.reason == "internal_error"
        assert rejected.detail == f"RuntimeError: boom on {source.topic}"
        assert (rejected.original_key, rejected.original_value) == (b"poison", value)
    _good_run_still_succeeds(h)
    assert len(h.rejected.refresh()) == 4


def test_a_fact_that_fails_to_stage_leaves_the_batch_untouched(
    harness: LoopHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception while the decided facts are staged (the second one's encoding
    raises) refuses the input and stages none of its facts or messages, so the same
    batch commits the other inputs exactly once."""
    import processor.store.staging as staging_module

    h = harness
    real_encode = staging_module.encode
    calls: list[int] = []

    def encode_failing_on_the_second_fact(fact: Any) -> bytes:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("encoding failed")
        return real_encode(fact)

    monkeypatch.setattr(staging_module, "encode", encode_failing_on_the_second_fact)
    doomed = new_submit("scalar", {"n": 2})
    source = h.produce(TopicName.COMMANDS, doomed.run_id, encode(doomed))
    rejected = h.drive(lambda: h.rejected.find(source), "the refusal of the doomed submit")
    assert (rejected.reason, rejected.detail) == ("internal_error", "RuntimeError: encoding failed")
    monkeypatch.setattr(staging_module, "encode", real_encode)
    assert h.facts(doomed.run_id) == []  # not one of its facts reached the journal
    assert h.loop_state(doomed.run_id) is None
    _good_run_still_succeeds(h)
