"""Awaits whose target speaks JSON: requests in the JSON shape, JSON completions admitted.

The same admission stage, the same refusals: only the decoding differs
(processor/facts/json_wire.py). Run on the embedded log and on Kafka.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from processor.clients.external import Responder
from processor.errors import ConfigurationError
from processor.facts import json_wire, tokens
from processor.facts.models import (
    BoundaryCompletion,
    BoundaryCompletionAdmitted,
    BoundaryRequest,
    InteractionTimedOut,
)
from processor.facts.topics import TopicName
from processor.transport.base import Record
from processor.transport.partitioner import partition_for
from processor.worker.pipeline import Pipeline
from tests.apps.support import LoopHarness, TopicTail
from tests.boundaries.test_awaits import finish, play, run_until_suspended, status
from tests.control.control_support import timers_held

JSON_HEADERS = (("content-type", b"application/vnd.processor.completion+json"),)
GENERIC_HEADERS = (
    ("content-type", b"application/json"),
    ("processor-schema", b"BoundaryCompletion"),
)


def json_requests(h: LoopHarness, pipeline: str, value: Any) -> tuple[str, list[dict[str, Any]]]:
    """Submit, play the worker until the run waits; its requests as raw JSON records."""
    tail = TopicTail(h.reader, h.name(TopicName.REQUESTS), h.deployment.topology.partitions)
    run_id = h.submit(pipeline, value)
    play(h, lambda: h.suspended(run_id), "suspension")
    records = [r for r in tail.new() if json.loads(r.value or b"{}").get("run_id") == run_id]
    for record in records:
        assert dict(record.headers)["content-type"] == json_wire.REQUEST_CONTENT_TYPE.encode()
        assert dict(record.headers)["processor-schema"] == b"BoundaryRequest"
    found = [json.loads(r.value or b"") for r in records]
    return run_id, sorted(found, key=lambda r: r["item_index"])


def answer(
    h: LoopHarness, run_id: str, document: dict[str, Any] | bytes, headers: Any = JSON_HEADERS
) -> Record:
    raw = document if isinstance(document, bytes) else json.dumps(document).encode()
    return h.produce(TopicName.COMPLETIONS, run_id, raw, headers=headers)


def admitted(h: LoopHarness, run_id: str) -> list[BoundaryCompletionAdmitted]:
    return [f for f in h.facts(run_id) if isinstance(f, BoundaryCompletionAdmitted)]


def refused(h: LoopHarness, record: Record) -> str:
    rejected = h.drive(lambda: h.rejected.find(record), "refusal")
    assert rejected.original_value == record.value  # kept with its bytes
    return rejected.reason


def test_a_json_request_answered_in_json_continues_the_run(harness: LoopHarness) -> None:
    h = harness
    run_id, (request,) = json_requests(h, "json_scalar", {"n": 7})
    assert request["request"] == {"question": 7}  # a JSON value, not bytes
    assert request["target"] == "json-echo" and request["run_id"] == run_id
    assert tokens.parse(request["resume_token"]) is not None
    answer(h, run_id, {"token": request["resume_token"], "outcome": "success", "payload": "yes"})
    finish(h, run_id)
    state = h.loop_state(run_id)
    assert state is not None and state.status == "succeeded"
    assert json.loads(state.result or b"") == {"answer": "yes"}
    (fact,) = admitted(h, run_id)
    assert (fact.outcome, fact.payload, fact.content_type) == (
        "success",
        b'"yes"',
        "application/json",
    )


def test_generic_json_headers_and_a_failure_outcome(harness: LoopHarness) -> None:
    h = harness
    run_id, (request,) = json_requests(h, "json_scalar", {"n": 1})
    document = {"token": request["resume_token"], "outcome": "failure", "error": "card declined"}
    answer(h, run_id, document, GENERIC_HEADERS)
    h.drive(lambda: status(h, run_id) == "failed", "run failed")
    state = h.loop_state(run_id)
    assert state is not None and "card declined" in (state.error or "")


def test_itemized_json_requests_release_in_index_order(harness: LoopHarness) -> None:
    h = harness
    run_id, requests = json_requests(h, "json_itemized", {"items": 3})
    assert [r["request"] for r in requests] == [{"i": 0}, {"i": 1}, {"i": 2}]
    for request in reversed(requests):
        token = request["resume_token"]
        answer(h, run_id, {"token": token, "outcome": "success", "payload": request["item_index"]})
    finish(h, run_id)
    state = h.loop_state(run_id)
    assert state is not None and json.loads(state.result or b"") == {"outputs": [0, 1, 2]}


def test_a_duplicate_json_completion_is_a_no_op_and_a_different_one_conflicts(
    harness: LoopHarness,
) -> None:
    h = harness
    run_id, (request,) = json_requests(h, "json_scalar", {"n": 2})
    document = {"token": request["resume_token"], "outcome": "success", "payload": {"v": 1}}
    answer(h, run_id, document)
    finish(h, run_id)
    duplicate = answer(h, run_id, {**document, "idempotency_key": "another-key"})
    conflicting = answer(h, run_id, {**document, "payload": {"v": 2}})
    assert refused(h, conflicting) == "conflicting_completion"
    assert h.rejected.find(duplicate) is None  # processed before the conflicting one
    assert len(admitted(h, run_id)) == 1


def test_an_avro_duplicate_of_a_json_completion_is_a_no_op(harness: LoopHarness) -> None:
    h = harness
    run_id, (request,) = json_requests(h, "json_scalar", {"n": 2})
    answer(h, run_id, {"token": request["resume_token"], "outcome": "success", "payload": [1, 2]})
    finish(h, run_id)
    same = BoundaryCompletion(
        token=request["resume_token"], idempotency_key="avro", outcome="success", payload=b"[1, 2]"
    )
    h.produce_model(TopicName.COMPLETIONS, run_id, same)
    marker = answer(h, run_id, {"token": request["resume_token"], "outcome": "success"})
    assert refused(h, marker) == "conflicting_completion"  # processed after the Avro one
    assert len(h.rejected.refresh()) == 1 and len(admitted(h, run_id)) == 1


def test_a_forged_token_in_json_is_invalid_token(harness: LoopHarness) -> None:
    h = harness
    run_id, (request,) = json_requests(h, "json_scalar", {"n": 3})
    token = request["resume_token"]
    forged = token[:-2] + ("A" if token[-2] != "A" else "B") + token[-1]
    record = answer(h, run_id, {"token": forged, "outcome": "success", "payload": 1})
    assert refused(h, record) == "invalid_token"
    assert not admitted(h, run_id) and h.suspended(run_id)


def test_a_token_for_an_unknown_interaction_in_json(harness: LoopHarness) -> None:
    h = harness
    run_id, (request,) = json_requests(h, "json_scalar", {"n": 3})
    claims = tokens.parse(request["resume_token"])
    assert claims is not None
    other = tokens.sign(h.keys, tokens.TokenClaims(run_id, 9, "b9.0", claims.epoch))
    record = answer(h, run_id, {"token": other, "outcome": "success"})
    assert refused(h, record) == "unknown_interaction"


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b"[]",
        b'{"token": "x"}',
        b'{"token": "x", "outcome": "success", "paylaod": 1}',
    ],
)
def test_a_json_document_that_is_not_the_shape_is_malformed(
    harness: LoopHarness, raw: bytes
) -> None:
    h = harness
    run_id, _ = json_requests(h, "json_scalar", {"n": 4})
    record = answer(h, run_id, raw)
    assert refused(h, record) == "malformed"
    assert h.suspended(run_id)


def test_a_late_json_completion_loses_to_the_deadline(harness: LoopHarness) -> None:
    h = harness
    run_id, (request,) = json_requests(h, "json_scalar", {"n": 5})
    h.clock.advance_to(request["deadline_ms"])
    document = {"token": request["resume_token"], "outcome": "success", "payload": "late"}
    with timers_held(h):
        record = answer(h, run_id, document)
        assert refused(h, record) == "late_completion"
    h.drive(lambda: status(h, run_id) == "failed", "run failed by the timeout")
    again = answer(h, run_id, {**document, "payload": "later"})
    assert refused(h, again) == "run_terminal"
    assert sum(isinstance(f, InteractionTimedOut) for f in h.facts(run_id)) == 1
    assert not admitted(h, run_id)


def test_avro_targets_still_get_avro_requests(harness: LoopHarness) -> None:
    _, (request,) = run_until_suspended(harness, "scalar", {"n": 1})
    assert isinstance(request, BoundaryRequest)


def test_a_wire_is_avro_or_json() -> None:
    pipeline = Pipeline("p")
    with pytest.raises(ConfigurationError, match="wire"):
        pipeline.await_step(target="t", timeout_s=1, wire="xml")  # type: ignore[arg-type]
    pipeline.await_step(target="t", timeout_s=1, wire="json")(lambda v: v)
    assert pipeline.spec().steps[0].awaits is not None
    assert pipeline.spec().steps[0].awaits.wire == "json"


def test_the_responder_answers_a_json_request_in_json(harness: LoopHarness) -> None:
    h = harness
    transport, topology = h.deployment.transport, h.deployment.topology
    completions = TopicTail(h.reader, h.name(TopicName.COMPLETIONS), topology.partitions)
    responder = Responder(
        transport, topology, {"json-echo": lambda request, value: {"echo": value}}, group="r-json"
    )
    stop = threading.Event()
    thread = threading.Thread(target=responder.run, args=(stop,), daemon=True)
    thread.start()
    try:
        run_id = h.submit("json_scalar", {"n": 9})
        play(h, lambda: status(h, run_id) == "succeeded", "answered by the responder")
    finally:
        stop.set()
        thread.join(30)
    state = h.loop_state(run_id)
    assert state is not None and json.loads(state.result or b"") == {
        "answer": {"echo": {"question": 9}}
    }
    (record,) = completions.new()
    assert json_wire.is_json_completion(record.headers)
    assert json.loads(record.value or b"")["outcome"] == "success"


def test_a_json_completion_on_the_wrong_partition_is_forwarded_with_its_headers(
    harness: LoopHarness,
) -> None:
    h = harness
    partitions = h.deployment.topology.partitions
    run_id, (request,) = json_requests(h, "json_scalar", {"n": 8})
    home = partition_for(run_id.encode(), partitions)
    stray = next(
        k for k in (f"k{i}" for i in range(1000)) if partition_for(k.encode(), partitions) != home
    )
    document = {"token": request["resume_token"], "outcome": "success", "payload": "found"}
    answer(h, stray, document)  # keyed by anything but the run id: lands elsewhere
    finish(h, run_id)
    state = h.loop_state(run_id)
    assert state is not None and json.loads(state.result or b"") == {"answer": "found"}
    assert not h.rejected.refresh()
