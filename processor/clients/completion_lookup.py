"""What became of a completion, asked later by its run and its idempotency key.

For a sender that did not wait (``complete`` without ``wait_s``, a 202 from the
HTTP API) or sent the completion some other way (kcat, its own producer): it knows
the run (its token names it) and the idempotency key (its receipt shows it, or the
sender set it). Read from the log, like the wait by position
(``completion_receipt.py``):

- admitted: the run's facts hold a ``BoundaryCompletionAdmitted`` of an await with
  that ``idempotency_key``;
- refused: admission.rejected, on the run's partition, holds a ``Rejected`` keyed by
  the run whose original bytes are a completion (Avro or the JSON shape) with that
  key; the latest such refusal is the answer.

Admitted wins: a refusal under a key that was admitted is a later copy (another
answer to the same interaction, refused ``conflicting_completion``). A rejection is
keyed by the run its token names, even a forged token's, or, when the token is no
token at all, by the key the completion was produced with. Bytes that are not a
completion (``malformed`` JSON, garbage) carry no idempotency key to match: they show
in ``processor rejected`` only. Nothing found: not decided yet, never written, or
written for another run.
"""

from __future__ import annotations

from collections.abc import Iterable

from processor.admission.arrivals import record_position
from processor.clients.completion_receipt import CompletionReceipt
from processor.errors import FactDecodeError
from processor.facts import json_wire, tokens
from processor.facts.codec import codec
from processor.facts.models import (
    BoundaryCompletion,
    BoundaryCompletionAdmitted,
    FactHeader,
    Rejected,
)
from processor.transport.base import Reader, Record, TopicPartition

__all__ = ["admission_with_key", "find_completion", "latest_refusal", "refusal_with_key"]


def admission_with_key(facts: Iterable[FactHeader], key: str) -> CompletionReceipt | None:
    """The first admission of an await's completion carrying ``key`` among a run's facts."""
    for fact in facts:
        if isinstance(fact, BoundaryCompletionAdmitted) and _answers_await(fact, key):
            return _admitted(fact)
    return None


def _answers_await(fact: BoundaryCompletionAdmitted, key: str) -> bool:
    return fact.source == "await" and fact.idempotency_key == key


def _admitted(fact: BoundaryCompletionAdmitted) -> CompletionReceipt:
    # An await's completion is caused by the record it was read from (-1: never else).
    _, partition, offset = record_position(fact.cause_id) or ("", -1, -1)
    return CompletionReceipt(
        run_id=fact.run_id,
        interaction=fact.interaction,
        outcome=fact.outcome,
        idempotency_key=fact.idempotency_key or "",
        partition=partition,
        offset=offset,
        admission="admitted",
        seq=fact.seq,
        decided_ms=fact.time_ms,
    )


def refusal_with_key(record: Record, run_key: bytes, key: str) -> CompletionReceipt | None:
    """The refusal in ``record`` (of admission.rejected) if it refused a completion of
    the run ``run_key`` carrying ``key``."""
    if record.key != run_key:  # cheap first: most rejections are of other runs
        return None
    try:
        rejected = codec().decode_as(record.value, Rejected)
    except FactDecodeError:
        return None
    completion = _completion_in(rejected.original_value)
    if completion is None or completion.idempotency_key != key:
        return None
    return _refused(rejected, completion, run_key.decode(errors="replace"))


def _completion_in(original: bytes | None) -> BoundaryCompletion | None:
    """The completion a refused record held, Avro or JSON (its headers are not kept)."""
    try:
        return codec().decode_as(original, BoundaryCompletion)
    except FactDecodeError:
        pass
    try:
        return json_wire.decode_completion(original)
    except FactDecodeError:
        return None


def _refused(rejected: Rejected, completion: BoundaryCompletion, run_id: str) -> CompletionReceipt:
    claims = tokens.parse(completion.token)
    return CompletionReceipt(
        run_id=run_id,
        interaction="" if claims is None else claims.interaction,
        outcome=completion.outcome,
        idempotency_key=completion.idempotency_key,
        partition=rejected.source_partition,
        offset=rejected.source_offset,
        admission="refused",
        refusal=rejected.reason,
        detail=rejected.detail,
        decided_ms=rejected.rejected_ms,
    )


def latest_refusal(
    reader: Reader, rejected: TopicPartition, run_id: str, key: str
) -> CompletionReceipt | None:
    """The last refusal of a completion of ``run_id`` carrying ``key`` on ``rejected`` (the
    partition of admission.rejected the run's key goes to), read up to its end."""
    run_key, found = run_id.encode(), None
    for batch in reader.read(rejected, 0):
        for record in batch:
            found = refusal_with_key(record, run_key, key) or found
    return found


def find_completion(
    facts: Iterable[FactHeader], reader: Reader, rejected: TopicPartition, run_id: str, key: str
) -> CompletionReceipt | None:
    """What became of the completion of ``run_id`` carrying ``key``: admitted (found
    among the run's ``facts``), else refused (on ``rejected``), else None."""
    return admission_with_key(facts, key) or latest_refusal(reader, rejected, run_id, key)
