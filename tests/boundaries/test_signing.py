"""Signed handoffs and key rotation, on both transports.

Only the processor may write ``boundary.checkpoints``: an unsigned, forged or
altered handoff is refused ``invalid_token``, kept in admission.rejected with its
bytes, and the loop goes on. A run waiting with a token of key A completes after
rotation to [B, A], and is refused once A is removed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from processor.config.settings import Settings
from processor.facts import handoff_signature, tokens
from processor.facts.keyring import KeyRing
from processor.facts.models import BoundaryCompletionAdmitted, CheckpointHandoff
from processor.facts.payload import derive_run_id
from processor.facts.topics import TopicName
from processor.transport.base import Record
from tests.apps.boundary_pipelines import app
from tests.apps.support import FakeClock, LoopHarness
from tests.boundaries.test_awaits import completion, finish, run_until_suspended, status

KEY_A = ("a", b"rotation-key-a-0123456789")
KEY_B = ("b", b"rotation-key-b-0123456789")

Opener = Callable[[KeyRing], LoopHarness]


@pytest.fixture
def open_loop(settings: Settings) -> Iterator[Opener]:
    """Open the processor loop with a key ring, closing the one before (a restart with
    new settings: same data dir, topics, group and fake clock)."""
    opened: list[LoopHarness] = []

    def open_(keys: KeyRing) -> LoopHarness:
        clock = FakeClock()
        if opened:
            opened[-1].close()
            clock = opened[-1].clock
        h = LoopHarness(settings.data_dir, app, clock, settings=settings, keys=keys)
        opened.append(h)
        return h

    try:
        yield open_
    finally:
        if opened:
            opened[-1].close()


def _refused_invalid_token(h: LoopHarness, source: Record, what: str) -> str:
    rejected = h.drive(lambda: h.rejected.find(source), f"the refusal of {what}")
    assert rejected.reason == "invalid_token", (what, rejected.detail)
    assert (rejected.original_key, rejected.original_value) == (source.key, source.value)
    return rejected.detail


def _admitted(h: LoopHarness, run_id: str) -> list[BoundaryCompletionAdmitted]:
    return [f for f in h.facts(run_id) if isinstance(f, BoundaryCompletionAdmitted)]


def test_unsigned_forged_and_altered_handoffs_are_refused_and_a_good_one_goes_through(
    open_loop: Opener,
) -> None:
    h = open_loop(KeyRing((KEY_A,)))
    run_id, _ = run_until_suspended(h, "waiter", 1)
    plain = CheckpointHandoff(
        source_run_id="upstream-7",
        checkpoint="go",
        target=f"run:{run_id}",
        idempotency_key="upstream-7/checkpoint/go",
        payload=b'{"go": true}',
    )
    good = handoff_signature.signed(h.keys, plain)
    starter = handoff_signature.signed(
        h.keys, plain.model_copy(update={"target": "pipeline:sink", "idempotency_key": "s-1"})
    )
    bad = {
        "unsigned (as written before signatures)": plain,
        "forged (another secret, same key id)": handoff_signature.signed(
            KeyRing((("a", b"not-the-deployment-key-0"),)), plain
        ),
        "payload swapped after signing": good.model_copy(update={"payload": b'{"go": "no"}'}),
        "target changed after signing": starter.model_copy(update={"target": f"run:{run_id}"}),
        "an unsigned start of a pipeline": plain.model_copy(
            update={"target": "pipeline:sink", "idempotency_key": "s-2"}
        ),
    }
    details = {
        what: _refused_invalid_token(h, h.produce_model(TopicName.CHECKPOINTS, run_id, v), what)
        for what, v in bad.items()
    }
    assert details["unsigned (as written before signatures)"] == "checkpoint handoff is not signed"
    assert "forged or altered" in details["payload swapped after signing"]
    assert h.suspended(run_id) and _admitted(h, run_id) == []
    assert h.loop_state(derive_run_id("s-2")) is None  # no run was started

    h.produce_model(TopicName.CHECKPOINTS, run_id, good)
    finish(h, run_id)
    state = h.loop_state(run_id)
    assert state is not None and json.loads(state.result or b"") == {"proceeded_with": {"go": True}}
    assert len(_admitted(h, run_id)) == 1
    assert len(h.rejected.refresh()) == len(bad)


def test_a_token_of_key_a_completes_after_rotation_to_b_a_and_not_after_a_is_removed(
    open_loop: Opener,
) -> None:
    h = open_loop(KeyRing((KEY_A,)))
    first, (first_request,) = run_until_suspended(h, "scalar", {"n": 1})
    second, (second_request,) = run_until_suspended(h, "scalar", {"n": 2})
    assert tokens.key_id(first_request.resume_token) == "a"

    h = open_loop(KeyRing((KEY_B, KEY_A)))  # rotation: B signs, A still verifies
    h.produce_model(TopicName.COMPLETIONS, first, completion(first_request, "yes"))
    finish(h, first)
    assert status(h, first) == "succeeded"
    third, (third_request,) = run_until_suspended(h, "scalar", {"n": 3})
    assert tokens.key_id(third_request.resume_token) == "b"

    h = open_loop(KeyRing((KEY_B,)))  # A removed: what it signed is refused
    late = h.produce_model(TopicName.COMPLETIONS, second, completion(second_request, "yes"))
    detail = _refused_invalid_token(h, late, "a completion with a token of the removed key")
    assert detail == "resume token is signed with key 'a', which is not configured"
    assert h.suspended(second) and _admitted(h, second) == []
    h.produce_model(TopicName.COMPLETIONS, third, completion(third_request, "yes"))
    finish(h, third)  # the loop goes on with B's tokens
    assert status(h, third) == "succeeded"
