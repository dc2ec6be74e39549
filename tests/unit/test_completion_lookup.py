"""Which records tell what became of a completion asked for by its run and idempotency
key (pure: no log here; the reads are tested in tests/boundaries/test_completion_lookup.py).
"""

from __future__ import annotations

import hashlib
from typing import Any

from processor.admission.arrivals import record_cause, record_position
from processor.clients.completion_lookup import admission_with_key, refusal_with_key
from processor.facts import json_wire, tokens
from processor.facts.codec import encode
from processor.facts.keyring import KeyRing
from processor.facts.models import (
    BoundaryCompletion,
    BoundaryCompletionAdmitted,
    FactHeader,
    InteractionTimedOut,
    Rejected,
)
from processor.transport.base import Record

COMPLETIONS = "boundary.completions"
TOKEN = tokens.sign(
    KeyRing.single(b"lookup-secret-0123456789abcdef"), tokens.TokenClaims("run-1", 1, "b1.0", 1)
)


def _header(seq: int, offset: int = 42) -> dict[str, Any]:
    cause = record_cause(COMPLETIONS, 1, offset)
    return {
        "run_id": "run-1",
        "seq": seq,
        "fact_key": f"k{seq}",
        "time_ms": 1000 + seq,
        "cause_id": cause,
    }


def _admitted(seq: int, key: str | None, source: str = "await") -> BoundaryCompletionAdmitted:
    return BoundaryCompletionAdmitted(
        **_header(seq, offset=40 + seq),
        boundary=1,
        interaction="b1.0",
        item_index=0,
        source=source,
        outcome="failure",
        payload=b"",
        content_type="application/json",
        error="declined",
        idempotency_key=key,
        payload_digest=b"d",
    )


def _completion(key: str, token: str = TOKEN) -> BoundaryCompletion:
    return BoundaryCompletion(token=token, idempotency_key=key, outcome="success", payload=b"1")


def _rejected(
    original: bytes | None,
    *,
    key: bytes = b"run-1",
    reason: str = "late_completion",
    named: bool = True,
) -> Record:
    """The rejection of ``original``, keyed by ``key``; ``named``: it names its run (the
    loop names it when the token parses; the record is keyed by the run either way)."""
    refusal = Rejected(
        reason=reason,
        detail=f"{reason}: why",
        source_topic=COMPLETIONS,
        source_partition=1,
        source_offset=42,
        original_key=key,
        original_value=original,
        run_id=key.decode() if named else None,
        rejected_ms=5000,
    )
    return Record("admission.rejected", 0, 3, key, encode(refusal))


def test_a_cause_gives_back_the_position_it_names() -> None:
    assert record_position(record_cause("p.boundary.completions", 3, 17)) == (
        "p.boundary.completions",
        3,
        17,
    )
    assert record_position("a-command-id") is None
    assert record_position("topic/x/17") is None


def test_the_admission_with_the_key_is_found_with_its_position_seq_and_time() -> None:
    facts: list[FactHeader] = [
        _admitted(3, "other"),
        _admitted(4, "k-1"),
        _admitted(5, "k-1"),  # the same key for a second interaction: the first is shown
    ]
    found = admission_with_key(facts, "k-1")
    assert found is not None
    assert found.as_dict() == {
        "run_id": "run-1",
        "interaction": "b1.0",
        "outcome": "failure",
        "idempotency_key": "k-1",
        "partition": 1,
        "offset": 44,
        "admission": "admitted",
        "queued": False,
        "seq": 4,
        "decided_ms": 1004,
    }
    assert admission_with_key(facts, "k-2") is None


def test_only_an_admitted_await_completion_counts() -> None:
    handoff = _admitted(3, "k-1", source="checkpoint")
    timed_out = InteractionTimedOut(
        **_header(4), boundary=1, interaction="b1.0", item_index=0, deadline_ms=5
    )
    assert admission_with_key([handoff, timed_out], "k-1") is None


def test_a_refused_avro_completion_is_found_by_its_key() -> None:
    found = refusal_with_key(_rejected(encode(_completion("k-1"))), b"run-1", "k-1")
    assert found is not None
    assert (found.admission, found.refusal, found.detail) == (
        "refused",
        "late_completion",
        "late_completion: why",
    )
    assert (found.run_id, found.interaction, found.outcome) == ("run-1", "b1.0", "success")
    assert (found.partition, found.offset, found.decided_ms, found.seq) == (1, 42, 5000, None)
    assert refusal_with_key(_rejected(encode(_completion("k-1"))), b"run-1", "k-2") is None


def test_a_refusal_is_of_the_run_it_is_keyed_by() -> None:
    elsewhere = _rejected(encode(_completion("k-1")), key=b"run-2")
    assert refusal_with_key(elsewhere, b"run-1", "k-1") is None


def test_a_refused_json_completion_is_found_by_its_key_or_its_derived_one() -> None:
    keyed = json_wire.completion_document(_completion("k-json"))
    assert refusal_with_key(_rejected(keyed), b"run-1", "k-json") is not None
    unkeyed = b'{"token":"' + TOKEN.encode() + b'","outcome":"failure","error":"no"}'
    derived = "json-" + hashlib.sha256(unkeyed).hexdigest()[:32]
    found = refusal_with_key(_rejected(unkeyed, reason="payload_too_large"), b"run-1", derived)
    assert found is not None and (found.outcome, found.refusal) == ("failure", "payload_too_large")


def test_a_token_that_is_no_token_is_found_under_the_key_it_was_sent_with() -> None:
    original = encode(_completion("k-1", token="not-a-token"))
    refused = _rejected(original, reason="invalid_token", named=False)
    found = refusal_with_key(refused, b"run-1", "k-1")
    assert found is not None
    assert (found.run_id, found.interaction, found.refusal) == ("run-1", "", "invalid_token")


def test_bytes_that_are_no_completion_match_no_key() -> None:
    assert refusal_with_key(_rejected(b"\x00garbage"), b"run-1", "k-1") is None
    assert refusal_with_key(_rejected(None), b"run-1", "k-1") is None
    not_rejected = Record("admission.rejected", 0, 3, b"run-1", b"{}")
    assert refusal_with_key(not_rejected, b"run-1", "k-1") is None
