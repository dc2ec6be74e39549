"""A sender asks later what became of a completion: ``Client.completion(run_id, key)``.

The completion was sent without waiting (or by another producer); the lookup finds
the admission among the run's facts, or the refusal in admission.rejected, by the
idempotency key the completion carries, on both transports. Each answer agrees with
what the wait by position (``complete(..., wait_s=...)``) says about the same record.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from processor.clients.client import Client
from processor.clients.external import CompletionClient
from processor.config.settings import Settings
from processor.facts import payload
from processor.facts.models import BoundaryCompletion
from processor.facts.topics import TopicName
from tests.apps.boundary_pipelines import app
from tests.apps.support import LoopHarness
from tests.boundaries.conftest import SECRET
from tests.boundaries.test_awaits import run_until_suspended
from tests.boundaries.test_completion_receipts import (
    WAIT_S,
    admitted_facts,
    answered,
    forged,
)
from tests.control.control_support import timers_held


@pytest.fixture
def client(harness: LoopHarness) -> Iterator[Client]:
    with Client(settings=harness.deployment.settings) as made:
        yield made


def test_an_admitted_completion_is_found_by_its_key_with_its_fact(
    harness: LoopHarness, client: Client
) -> None:
    h = harness
    run_id, (request,) = run_until_suspended(h, "scalar", {"n": 1})
    assert client.completion(run_id, "k-1") is None  # nothing sent yet

    sent = client.complete(request.resume_token, {"yes": 1}, "k-1")  # no wait: queued
    assert sent.queued
    found = h.drive(lambda: client.completion(run_id, "k-1"), "the completion decided")
    (fact,) = admitted_facts(h, run_id)
    assert (found.admission, found.refusal, found.detail) == ("admitted", None, None)
    assert (found.run_id, found.interaction, found.outcome) == (
        run_id,
        request.interaction,
        "success",
    )
    assert (found.partition, found.offset) == (sent.partition, sent.offset)
    assert (found.seq, found.decided_ms) == (fact.seq, fact.time_ms)


def test_a_later_copy_refused_leaves_the_key_admitted_another_key_is_refused(
    harness: LoopHarness, client: Client
) -> None:
    h = harness
    run_id, (request,) = run_until_suspended(h, "scalar", {"n": 2})
    token = request.resume_token
    first = answered(h, lambda: client.complete(token, {"yes": 1}, "k-1", wait_s=WAIT_S))
    clash = answered(h, lambda: client.complete(token, {"yes": 2}, "k-1", wait_s=WAIT_S))
    other = answered(h, lambda: client.complete(token, {"yes": 3}, "k-2", wait_s=WAIT_S))
    assert [first.refusal, clash.refusal, other.refusal] == [
        None,
        "conflicting_completion",
        "conflicting_completion",
    ]

    kept = client.completion(run_id, "k-1")
    assert kept is not None and (kept.admission, kept.offset) == ("admitted", first.offset)
    refused = client.completion(run_id, "k-2")
    assert refused is not None
    assert (refused.admission, refused.refusal, refused.detail) == (
        "refused",
        "conflicting_completion",
        other.detail,
    )
    assert (refused.partition, refused.offset) == (other.partition, other.offset)
    assert refused.interaction == request.interaction and refused.decided_ms
    assert client.completion(run_id, "k-3") is None


def test_a_forged_token_naming_the_run_is_found_refused_invalid_token(
    harness: LoopHarness, client: Client
) -> None:
    h = harness
    run_id, (request,) = run_until_suspended(h, "scalar", {"n": 3})
    fake = forged(request.resume_token)
    sent = answered(h, lambda: client.complete(fake, {"x": 1}, "forged-1", wait_s=WAIT_S))
    found = client.completion(run_id, "forged-1")
    assert found is not None
    assert (found.admission, found.refusal) == ("refused", "invalid_token")
    assert (found.detail, found.offset) == (sent.detail, sent.offset)
    assert found.interaction == request.interaction  # the claims, read from the forged token


def test_a_token_that_is_no_token_is_found_when_sent_keyed_by_the_run(
    harness: LoopHarness,
) -> None:
    h = harness
    run_id, _ = run_until_suspended(h, "scalar", {"n": 4})
    garbled = BoundaryCompletion(token="not-a-token", idempotency_key="nt-1", outcome="success")
    h.produce_model(TopicName.COMPLETIONS, run_id, garbled)  # as any producer would
    with Client(settings=h.deployment.settings) as client:
        found = h.drive(lambda: client.completion(run_id, "nt-1"), "the garbled one refused")
    assert (found.admission, found.refusal, found.interaction) == ("refused", "invalid_token", "")


def test_a_late_completion_is_found_refused_late(harness: LoopHarness, client: Client) -> None:
    h = harness
    run_id, (request,) = run_until_suspended(h, "scalar", {"n": 5})
    h.clock.advance_to(request.deadline_ms)
    with timers_held(h):  # decided before the timer: the late completion is refused
        answered(h, lambda: client.complete(request.resume_token, "late", "late-1", wait_s=WAIT_S))
    found = client.completion(run_id, "late-1")
    assert found is not None and (found.admission, found.refusal) == ("refused", "late_completion")


def test_an_oversized_json_completion_is_found_refused_payload_too_large(
    settings: Settings,
) -> None:
    limited = settings.model_copy(update={"max_payload_bytes": 256})
    h = LoopHarness.for_settings(limited, app, secret=SECRET)
    try:
        run_id, (request,) = run_until_suspended(h, "scalar", {"n": 6})
        # Another producer, in the JSON shape, with no check of its own.
        sender = CompletionClient(h.deployment.transport, h.deployment.topology)
        try:
            body = payload.dumps("x" * 1000)
            sender.send(request.resume_token, "success", body, None, "big-1", wire="json")
        finally:
            sender.close()
        with Client(settings=limited) as client:
            found = h.drive(lambda: client.completion(run_id, "big-1"), "the big one refused")
        assert (found.admission, found.refusal) == ("refused", "payload_too_large")
        assert found.outcome == "success" and h.suspended(run_id)
    finally:
        h.close()


def test_an_unknown_run_has_no_completion(harness: LoopHarness, client: Client) -> None:
    h = harness
    run_id, (request,) = run_until_suspended(h, "scalar", {"n": 7})
    answered(h, lambda: client.complete(request.resume_token, 1, "k-1", wait_s=WAIT_S))
    assert client.completion(run_id, "k-1") is not None
    assert client.completion("no-such-run", "k-1") is None
    # The key of another run's completion is not this run's.
    other, _ = run_until_suspended(h, "scalar", {"n": 8})
    assert client.completion(other, "k-1") is None
