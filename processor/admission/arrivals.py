"""Protocol-specific decoding: await completions and checkpoint handoffs become Arrivals.

After this stage both have one shape, and one admission function handles them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

from processor.facts import handoff_signature, json_wire, tokens
from processor.facts.codec import codec
from processor.facts.json_wire import HeaderPairs
from processor.facts.keyring import KeyRing
from processor.facts.models import BoundaryCompletion, CheckpointHandoff
from processor.facts.payload import InvalidPayloadError, canonical_json, derive_run_id
from processor.model import event_waits

__all__ = [
    "Arrival",
    "Refusal",
    "canonical_payload",
    "completion_arrival",
    "handoff_arrival",
    "record_cause",
    "record_position",
    "routing_run_id",
]

JSON = "application/json"


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: str
    detail: str
    run_id: str | None = None


@dataclass(frozen=True, slots=True)
class Arrival:
    """A correlated payload for a boundary, whatever protocol brought it."""

    source: Literal["await", "checkpoint", "event"]
    run_id: str
    cause_id: str
    outcome: str
    payload: bytes
    content_type: str
    error: str | None
    idempotency_key: str
    token: str | None = None
    claims: tokens.TokenClaims | None = None
    checkpoint: str | None = None
    start_pipeline: str | None = None
    # An event's name, correlation fields, the wait it names, its correlation key.
    event: str | None = None
    correlation: tuple[tuple[str, str], ...] = ()
    settles: str | None = None
    key: str | None = None  # an event by correlation key: the key

    @property
    def digest(self) -> bytes:
        """Identity of the completion's content: duplicates compare equal by it (an
        event's: its name and id)."""
        if self.event is not None:
            return event_waits.event_digest(self.event, self.idempotency_key)
        digest = hashlib.sha256()
        for part in (self.outcome.encode(), self.payload, (self.error or "").encode()):
            digest.update(len(part).to_bytes(8, "big"))
            digest.update(part)
        return digest.digest()


def record_cause(topic: str, partition: int, offset: int) -> str:
    """The ``cause_id`` of the facts decided on the input record read at this position
    (a sender finds what became of its completion by it)."""
    return f"{topic}/{partition}/{offset}"


def record_position(cause: str) -> tuple[str, int, int] | None:
    """The topic, partition and offset a ``record_cause`` names (None: not one; a
    command's facts carry its command id). Topic names hold no slash."""
    topic, _, rest = cause.partition("/")
    partition, _, offset = rest.partition("/")
    if not (topic and partition.isdecimal() and offset.isdecimal()):
        return None
    return topic, int(partition), int(offset)


def routing_run_id(
    topic_is_completion: bool, value: bytes | None, headers: HeaderPairs = ()
) -> str | None:
    """The run a boundary message is addressed to, without verifying it (for routing)."""
    if topic_is_completion:
        completion = _decode_completion(value, headers)
        claims = tokens.parse(completion.token)
        return None if claims is None else claims.run_id
    return _handoff_run_id(codec().decode_as(value, CheckpointHandoff))


def completion_arrival(
    value: bytes | None, keys: KeyRing, cause_id: str, headers: HeaderPairs = ()
) -> Arrival | Refusal:
    """Decode and authenticate an await completion (raises FactDecodeError if undecodable).

    A record whose headers name the JSON shape (``processor.facts.json_wire``) is
    decoded from JSON, any other as Avro; both give the same BoundaryCompletion.
    """
    completion = _decode_completion(value, headers)
    claims = tokens.verify(keys, completion.token)
    if claims is None:  # refused; its run, if the token names one, for the record
        claimed = tokens.parse(completion.token)
        run_id = claimed.run_id if claimed is not None else None
        return Refusal("invalid_token", _token_problem(keys, completion.token), run_id)
    body = canonical_payload(completion.payload, completion.content_type, claims.run_id)
    if isinstance(body, Refusal):
        return body
    return Arrival(
        source="await",
        run_id=claims.run_id,
        cause_id=cause_id,
        outcome=completion.outcome,
        payload=body,
        content_type=JSON,
        error=completion.error,
        idempotency_key=completion.idempotency_key,
        token=completion.token,
        claims=claims,
    )


def _decode_completion(value: bytes | None, headers: HeaderPairs) -> BoundaryCompletion:
    if json_wire.is_json_completion(headers):
        return json_wire.decode_completion(value)
    return codec().decode_as(value, BoundaryCompletion)


def _token_problem(keys: KeyRing, token: str) -> str:
    kid = tokens.key_id(token)
    if kid is not None and keys.get(kid) is None:
        return f"resume token is signed with key {kid!r}, which is not configured"
    return "resume token is forged, altered or not a token"


def handoff_arrival(value: bytes | None, keys: KeyRing, cause_id: str) -> Arrival | Refusal:
    """Decode and authenticate a checkpoint handoff (raises FactDecodeError if undecodable).

    The signature is checked first: nothing of an unsigned, forged or altered
    handoff is trusted, not even its target.
    """
    handoff = codec().decode_as(value, CheckpointHandoff)
    run_id = _handoff_run_id(handoff)
    problem = handoff_signature.problem(keys, handoff)
    if problem is not None:
        return Refusal("invalid_token", problem, run_id)
    if run_id is None:
        detail = f"target must be pipeline:<name> or run:<id>, got {handoff.target!r}"
        return Refusal("malformed", detail)
    body = canonical_payload(handoff.payload, handoff.content_type, run_id)
    if isinstance(body, Refusal):
        return body
    pipeline = (
        handoff.target.removeprefix("pipeline:") if handoff.target.startswith("pipeline:") else None
    )
    return Arrival(
        source="checkpoint",
        run_id=run_id,
        cause_id=cause_id,
        outcome="success",
        payload=body,
        content_type=JSON,
        error=None,
        idempotency_key=handoff.idempotency_key,
        checkpoint=handoff.checkpoint,
        start_pipeline=pipeline,
    )


def _handoff_run_id(handoff: CheckpointHandoff) -> str | None:
    if handoff.target.startswith("run:") and len(handoff.target) > 4:
        return handoff.target.removeprefix("run:")
    if handoff.target.startswith("pipeline:") and len(handoff.target) > 9:
        return derive_run_id(handoff.idempotency_key)
    return None


def canonical_payload(raw: bytes, content_type: str, run_id: str) -> bytes | Refusal:
    if content_type.split(";", maxsplit=1)[0].strip() != JSON:
        return Refusal("malformed", f"unsupported content type {content_type!r}", run_id)
    if not raw:
        return b"null"
    try:
        return canonical_json(raw)
    except InvalidPayloadError as exc:
        return Refusal("malformed", f"payload: {exc}", run_id)
