"""A sender learns what became of its completion: ``Client.complete(..., wait_s=...)``.

The client waits, up to its deadline, for the admission stage's decision on the
completion it produced (found by its position: the admitted fact's cause, the
rejection's source, the processor group's committed offset), on both transports.
The loop runs here by hand while the client waits in another thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import pytest

from processor.clients.client import Client
from processor.config.settings import Settings
from processor.facts import tokens
from processor.facts.keyring import KeyRing
from processor.facts.models import BoundaryCompletionAdmitted, InteractionTimedOut
from processor.facts.topics import TopicName
from processor.transport.deployment import Deployment, ensure_topics
from tests.apps.boundary_pipelines import app
from tests.apps.support import LoopHarness
from tests.boundaries.conftest import SECRET
from tests.boundaries.test_awaits import run_until_suspended, status
from tests.control.control_support import timers_held

if TYPE_CHECKING:
    from processor.clients.completion_receipt import CompletionReceipt

WAIT_S = 30.0


@pytest.fixture
def client(harness: LoopHarness) -> Iterator[Client]:
    with Client(settings=harness.deployment.settings) as made:
        yield made


def answered(h: LoopHarness, send: Callable[[], CompletionReceipt]) -> CompletionReceipt:
    """``send`` (a completion with a wait) in another thread, while the loop runs here."""
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(send)
        h.drive(future.done, "the completion's receipt")
        return future.result()


def forged(token: str) -> str:
    """The token's claims with another MAC: parseable, never the processor's."""
    return token[:-2] + ("A" if token[-2] != "A" else "B") + token[-1]


def admitted_facts(h: LoopHarness, run_id: str) -> list[BoundaryCompletionAdmitted]:
    return [f for f in h.facts(run_id) if isinstance(f, BoundaryCompletionAdmitted)]


def test_the_first_answer_is_admitted_the_same_again_a_duplicate_another_a_conflict(
    harness: LoopHarness, client: Client
) -> None:
    h = harness
    run_id, (request,) = run_until_suspended(h, "scalar", {"n": 1})
    token = request.resume_token

    first = answered(h, lambda: client.complete(token, {"yes": 1}, wait_s=WAIT_S))
    assert (first.admission, first.refusal) == ("admitted", None)
    assert (first.run_id, first.interaction) == (run_id, request.interaction)
    (fact,) = admitted_facts(h, run_id)
    completions = h.name(TopicName.COMPLETIONS)
    assert fact.cause_id == f"{completions}/{first.partition}/{first.offset}"
    version = h.loop_state(run_id).version  # type: ignore[union-attr]

    again = answered(h, lambda: client.complete(token, {"yes": 1}, wait_s=WAIT_S))
    assert (again.admission, again.refusal) == ("duplicate", None)
    assert again.offset > first.offset
    assert h.loop_state(run_id).version == version  # type: ignore[union-attr]

    other = answered(h, lambda: client.complete(token, {"yes": 2}, wait_s=WAIT_S))
    assert (other.admission, other.refusal) == ("refused", "conflicting_completion")
    assert len(admitted_facts(h, run_id)) == 1


def test_a_failure_answer_is_admitted_too(harness: LoopHarness, client: Client) -> None:
    h = harness
    run_id, (request,) = run_until_suspended(h, "scalar", {"n": 2})
    receipt = answered(h, lambda: client.fail(request.resume_token, "declined", wait_s=WAIT_S))
    assert (receipt.admission, receipt.outcome) == ("admitted", "failure")
    h.drive(lambda: status(h, run_id) == "failed", "the run failed")


def test_a_forged_token_is_refused_invalid_token(harness: LoopHarness, client: Client) -> None:
    h = harness
    run_id, (request,) = run_until_suspended(h, "scalar", {"n": 3})
    receipt = answered(
        h, lambda: client.complete(forged(request.resume_token), {"x": 1}, wait_s=WAIT_S)
    )
    assert (receipt.admission, receipt.refusal) == ("refused", "invalid_token")
    assert receipt.detail and "forged" in receipt.detail
    assert not admitted_facts(h, run_id) and h.suspended(run_id)


def test_an_answer_at_the_deadline_is_refused_late(harness: LoopHarness, client: Client) -> None:
    h = harness
    run_id, (request,) = run_until_suspended(h, "scalar", {"n": 4})
    h.clock.advance_to(request.deadline_ms)
    with timers_held(h):  # decided before the timer: the timeout facts carry its cause
        receipt = answered(
            h, lambda: client.complete(request.resume_token, "too late", wait_s=WAIT_S)
        )
    assert (receipt.admission, receipt.refusal) == ("refused", "late_completion")
    assert any(isinstance(f, InteractionTimedOut) for f in h.facts(run_id))
    assert not admitted_facts(h, run_id)


def test_an_answer_to_a_run_that_ended_is_refused_run_terminal(
    harness: LoopHarness, client: Client
) -> None:
    h = harness
    run_id, (request,) = run_until_suspended(h, "scalar", {"n": 5})
    h.clock.advance_to(request.deadline_ms)
    h.drive(lambda: status(h, run_id) == "failed", "the run failed by its timeout")
    receipt = answered(h, lambda: client.complete(request.resume_token, "after", wait_s=WAIT_S))
    assert (receipt.admission, receipt.refusal) == ("refused", "run_terminal")


def test_an_answer_over_the_processors_limit_is_refused_payload_too_large(
    settings: Settings,
) -> None:
    limited = settings.model_copy(update={"max_payload_bytes": 256})
    h = LoopHarness.for_settings(limited, app, secret=SECRET)
    try:
        run_id, (request,) = run_until_suspended(h, "scalar", {"n": 6})
        # A sender whose own limit is larger than the processor's: the processor refuses.
        with Client(settings=limited, max_payload_bytes=4096) as sender:
            receipt = answered(
                h, lambda: sender.complete(request.resume_token, "x" * 1000, wait_s=WAIT_S)
            )
        assert (receipt.admission, receipt.refusal) == ("refused", "payload_too_large")
        assert h.suspended(run_id)  # the interaction is still open: a smaller answer may follow
    finally:
        h.close()


def test_without_a_processor_the_wait_ends_at_its_deadline_queued(settings: Settings) -> None:
    deployment = Deployment.from_settings(settings)
    ensure_topics(deployment)
    claims = tokens.TokenClaims("run-nobody-runs", 1, "b1.0", 1)
    token = tokens.sign(KeyRing.single(SECRET), claims)
    with Client(settings=settings) as lonely:
        started = time.monotonic()
        receipt = lonely.complete(token, {"x": 1}, wait_s=1.0)
        waited = time.monotonic() - started
    assert (receipt.admission, receipt.refusal) == ("queued", None)
    assert receipt.offset >= 0 and receipt.run_id == "run-nobody-runs"
    assert 1.0 <= waited < 15.0


def test_without_a_wait_the_answer_is_queued_at_once(harness: LoopHarness, client: Client) -> None:
    h = harness
    run_id, (request,) = run_until_suspended(h, "scalar", {"n": 7})
    receipt = client.complete(request.resume_token, {"quick": True})
    assert (receipt.admission, receipt.run_id) == ("queued", run_id)
    h.drive(lambda: admitted_facts(h, run_id), "the queued answer admitted")
