"""Checkpoint handoff signatures: what they cover, rotation, and every way to fail."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from processor.admission.arrivals import Arrival, Refusal, handoff_arrival
from processor.facts import handoff_signature
from processor.facts.codec import SCHEMA_DIR, encode
from processor.facts.keyring import KeyRing
from processor.facts.models import CheckpointHandoff
from tests.unit.test_schema_compatibility import _write_single_object

A = ("a", b"key-a-0123456789abcdef")
B = ("b", b"key-b-0123456789abcdef")
SIGNED_FIELDS = ("source_run_id", "checkpoint", "target", "idempotency_key", "content_type")

handoffs = st.builds(
    CheckpointHandoff,
    source_run_id=st.text(max_size=30),
    checkpoint=st.text(max_size=20),
    target=st.one_of(
        st.text(min_size=1, max_size=20).map("pipeline:".__add__),
        st.text(min_size=1, max_size=20).map("run:".__add__),
    ),
    idempotency_key=st.text(max_size=30),
    payload=st.binary(max_size=64),
    content_type=st.just("application/json"),
)


@given(handoffs)
def test_a_signed_handoff_verifies_with_every_ring_that_holds_its_key(
    handoff: CheckpointHandoff,
) -> None:
    signed = handoff_signature.signed(KeyRing((A,)), handoff)
    assert signed.signature is not None and signed.signature.startswith("v1.a.")
    assert handoff_signature.problem(KeyRing((A,)), signed) is None
    assert handoff_signature.problem(KeyRing((B, A)), signed) is None  # rotated, A kept


@given(handoffs)
def test_a_handoff_of_a_removed_key_or_unsigned_is_refused(handoff: CheckpointHandoff) -> None:
    signed = handoff_signature.signed(KeyRing((A,)), handoff)
    assert handoff_signature.problem(KeyRing((B,)), signed) == (
        "checkpoint handoff is signed with key 'a', which is not configured"
    )
    assert handoff_signature.problem(KeyRing((A,)), handoff) == "checkpoint handoff is not signed"


@given(handoffs, st.sampled_from(SIGNED_FIELDS), st.text(min_size=1, max_size=5))
def test_changing_any_signed_field_after_signing_is_refused(
    handoff: CheckpointHandoff, field: str, suffix: str
) -> None:
    ring = KeyRing((A,))
    signed = handoff_signature.signed(ring, handoff)
    altered = signed.model_copy(update={field: getattr(signed, field) + suffix})
    assert handoff_signature.problem(ring, altered) == (
        "checkpoint handoff signature does not match: forged or altered"
    )


@given(handoffs, st.binary(max_size=64))
def test_swapping_the_payload_after_signing_is_refused(
    handoff: CheckpointHandoff, payload: bytes
) -> None:
    ring = KeyRing((A,))
    signed = handoff_signature.signed(ring, handoff)
    swapped = signed.model_copy(update={"payload": payload})
    assert (handoff_signature.problem(ring, swapped) is None) == (payload == handoff.payload)


@given(handoffs, st.data())
def test_any_altered_signature_is_refused(handoff: CheckpointHandoff, data: st.DataObject) -> None:
    ring = KeyRing((A,))
    signature = handoff_signature.sign(ring, handoff)
    index = data.draw(st.integers(0, len(signature) - 1))
    replacement = data.draw(st.sampled_from("ABCabc012-_.="))
    altered = signature[:index] + replacement + signature[index + 1 :]
    if altered != signature:
        forged = handoff.model_copy(update={"signature": altered})
        assert handoff_signature.problem(ring, forged) is not None


def test_a_handoff_signed_with_another_secret_under_the_same_id_is_forged() -> None:
    handoff = _handoff()
    forged = handoff_signature.signed(KeyRing((("a", b"an-attackers-own-secret"),)), handoff)
    assert handoff_signature.problem(KeyRing((A,)), forged) == (
        "checkpoint handoff signature does not match: forged or altered"
    )


def test_admission_refuses_unauthentic_handoffs_as_invalid_token_before_anything_else() -> None:
    """Even a malformed target is not looked at before the signature."""
    ring = KeyRing((A,))
    good = handoff_signature.signed(ring, _handoff())
    assert isinstance(handoff_arrival(encode(good), ring, "c"), Arrival)
    for bad in (
        _handoff(),
        good.model_copy(update={"target": "run:someone-else"}),
        good.model_copy(update={"payload": b'{"amount": 1000000}'}),
        _handoff(target="nowhere"),
    ):
        refusal = handoff_arrival(encode(bad), ring, "c")
        assert isinstance(refusal, Refusal) and refusal.reason == "invalid_token", bad


def _handoff(**changes: Any) -> CheckpointHandoff:
    fields: dict[str, Any] = {
        "source_run_id": "src",
        "checkpoint": "ready",
        "target": "run:r-1",
        "idempotency_key": "src/checkpoint/ready",
        "payload": b'{"amount": 1}',
    }
    return CheckpointHandoff(**{**fields, **changes})


def test_a_handoff_written_with_the_schema_before_signatures_is_refused_unsigned() -> None:
    """What an older processor left in boundary.checkpoints decodes, and is refused."""
    old = SCHEMA_DIR / "history" / "CheckpointHandoff.f9ea4120321d4da1.avsc"
    old_schema = json.loads(old.read_text())
    assert "signature" not in {f["name"] for f in old_schema["fields"]}
    record = _handoff().model_dump(exclude={"signature"})
    refusal = handoff_arrival(_write_single_object(old_schema, record), KeyRing((A,)), "c")
    assert isinstance(refusal, Refusal)
    assert (refusal.reason, refusal.detail) == ("invalid_token", "checkpoint handoff is not signed")
    assert refusal.run_id == "r-1"
