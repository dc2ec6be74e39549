"""The payload limit as a pure rule: the core gets it as a parameter (``Context``)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.admission.admit import admit
from processor.admission.arrivals import Arrival
from processor.clients.client import new_submit
from processor.config.settings import Settings
from processor.facts import payload
from processor.facts.models import CommandReply
from processor.model.decide import Context, decide_submit
from tests.unit.test_admission import KEYS, Catalog, World

LIMIT = 64


def context(limit: int | None) -> Context:
    return Context(Catalog(), 10_000, KEYS, limit)


@given(size=st.integers(min_value=0, max_value=300), limit=st.integers(min_value=1, max_value=300))
def test_oversize_names_the_size_and_the_limit_only_beyond_it(size: int, limit: int) -> None:
    problem = payload.oversize(b"x" * size, limit, "run input")
    if size <= limit:
        assert problem is None
    else:
        assert problem == f"run input is {size} bytes, over the limit of {limit} bytes"
    assert payload.oversize(b"x" * size, None, "run input") is None  # no limit


def test_check_size_raises_a_value_error_that_is_not_retryable_by_the_worker() -> None:
    with pytest.raises(payload.PayloadTooLarge) as raised:
        payload.check_size(b"x" * (LIMIT + 1), LIMIT, "output of step 'a'")
    assert isinstance(raised.value, ValueError)
    assert isinstance(raised.value, payload.InvalidPayloadError)  # the executor: retryable=False
    payload.check_size(b"x" * LIMIT, LIMIT, "output of step 'a'")


def _input_of(size: int) -> str:
    return "x" * (size - 2)  # a JSON string: two quotes more


def test_a_submit_over_the_limit_is_refused_with_a_reply_and_changes_nothing() -> None:
    command = new_submit("awaiting", _input_of(LIMIT + 1))
    decision = decide_submit(command, None, context(LIMIT))
    assert decision.refusal == "payload_too_large" and not decision.facts
    assert decision.detail == f"run input is {LIMIT + 1} bytes, over the limit of {LIMIT} bytes"
    (reply,) = [e.value for e in decision.emits]
    assert isinstance(reply, CommandReply) and reply.refusal == "payload_too_large"
    assert reply.created is False


def test_a_submit_at_the_limit_or_without_a_limit_starts_the_run() -> None:
    for limit, size in ((LIMIT, LIMIT), (None, LIMIT * 100)):
        decision = decide_submit(new_submit("awaiting", _input_of(size)), None, context(limit))
        assert decision.refusal is None and decision.facts


def _completion(world: World, value: object) -> Arrival:
    arrival = world.arrival(world.requests[0], value)
    assert isinstance(arrival, Arrival)
    return arrival


def test_a_completion_over_the_limit_is_refused_at_the_limit_admitted() -> None:
    world = World()
    over = _completion(world, _input_of(LIMIT + 1))
    decision = admit(over, world.state, dataclasses.replace(world.ctx, max_payload_bytes=LIMIT))
    assert decision.refusal == "payload_too_large" and not decision.facts
    assert decision.detail == (
        f"completion payload is {LIMIT + 1} bytes, over the limit of {LIMIT} bytes"
    )
    at_limit = _completion(world, _input_of(LIMIT))
    decision = admit(at_limit, world.state, dataclasses.replace(world.ctx, max_payload_bytes=LIMIT))
    assert decision.refusal is None
    assert type(decision.facts[0]).__name__ == "BoundaryCompletionAdmitted"


def test_the_default_is_below_kafkas_default_message_size(monkeypatch: pytest.MonkeyPatch) -> None:
    default = Settings.model_fields["max_payload_bytes"].default
    assert default == 512 * 1024 < 1024 * 1024  # message.max.bytes' default: 1 MiB
    monkeypatch.setenv("PROCESSOR_MAX_PAYLOAD_BYTES", "4096")
    assert Settings().max_payload_bytes == 4096
