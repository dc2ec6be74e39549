"""Which records of the log tell what became of a completion (pure: no log here)."""

from __future__ import annotations

from typing import Any

from processor.admission.arrivals import record_cause
from processor.clients.completion_receipt import CompletionReceipt, admitted_by, refusal_of
from processor.facts.codec import encode
from processor.facts.models import BoundaryCompletionAdmitted, InteractionTimedOut, Rejected
from processor.transport.base import Record

COMPLETIONS = "boundary.completions"
CAUSE = record_cause(COMPLETIONS, 1, 42)


def _fact_record(fact: Any, key: bytes = b"run-1") -> Record:
    return Record("runs.facts", 1, 7, key, encode(fact))


def _header(cause: str = CAUSE) -> dict[str, Any]:
    return {"run_id": "run-1", "seq": 9, "fact_key": "k", "time_ms": 1, "cause_id": cause}


def _admitted(cause: str = CAUSE) -> BoundaryCompletionAdmitted:
    return BoundaryCompletionAdmitted(
        **_header(cause),
        boundary=1,
        interaction="b1.0",
        item_index=0,
        source="await",
        outcome="success",
        payload=b"1",
        content_type="application/json",
        payload_digest=b"d",
    )


def _rejected(offset: int, reason: str = "invalid_token") -> Record:
    refusal = Rejected(
        reason=reason,
        detail="why",
        source_topic=COMPLETIONS,
        source_partition=1,
        source_offset=offset,
        rejected_ms=1,
    )
    return Record("admission.rejected", 0, 3, b"run-1", encode(refusal))


def test_the_cause_names_the_record_read() -> None:
    assert CAUSE == "boundary.completions/1/42"


def test_only_the_admission_of_that_cause_for_that_run_admits_it() -> None:
    assert admitted_by(_fact_record(_admitted()), b"run-1", CAUSE)
    assert not admitted_by(_fact_record(_admitted()), b"run-1", record_cause(COMPLETIONS, 1, 43))
    assert not admitted_by(_fact_record(_admitted(), key=b"run-2"), b"run-1", CAUSE)
    # A late completion's timeout facts carry its cause too: they admit nothing.
    timed_out = InteractionTimedOut(
        **_header(), boundary=1, interaction="b1.0", item_index=0, deadline_ms=5
    )
    assert not admitted_by(_fact_record(timed_out), b"run-1", CAUSE)
    assert not admitted_by(Record("runs.facts", 1, 8, b"run-1", b"\x00garbage"), b"run-1", CAUSE)


def test_a_rejection_refuses_the_record_it_names_as_its_source() -> None:
    found = refusal_of(_rejected(42), (COMPLETIONS, 1, 42))
    assert found is not None and found.reason == "invalid_token"
    assert refusal_of(_rejected(41), (COMPLETIONS, 1, 42)) is None
    assert refusal_of(_rejected(42), (COMPLETIONS, 0, 42)) is None


def test_a_receipt_shows_its_refusal_only_when_refused() -> None:
    sent = CompletionReceipt("run-1", "b1.0", "success", "key", 1, 42)
    assert sent.queued and sent.as_dict()["admission"] == "queued"
    assert "refusal" not in sent.as_dict()
    refused = CompletionReceipt(
        "run-1", "b1.0", "success", "key", 1, 42, "refused", "late_completion", "too late"
    )
    assert not refused.queued
    assert refused.as_dict() == {
        "run_id": "run-1",
        "interaction": "b1.0",
        "outcome": "success",
        "idempotency_key": "key",
        "partition": 1,
        "offset": 42,
        "admission": "refused",
        "queued": False,
        "refusal": "late_completion",
        "detail": "too late",
    }
