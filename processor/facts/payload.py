"""User payloads (run input, step output) are JSON carried as canonical bytes.

``loads`` accepts only documents within two bounds, so that every process (and
every replay) decides the same way on the same bytes, whatever its interpreter's
limits, and no payload can exhaust the stack of the processor or a worker:

- ``MAX_INT_DIGITS``: an integer literal has at most 1,000 digits (Python
  refuses more than 4,300 by default, configurably; floats are unaffected);
- ``MAX_DEPTH``: arrays and objects nest at most 128 levels deep.

A document beyond either is refused with ``InvalidPayloadError``, like any
other invalid JSON: the processor answers ``invalid_input`` / ``malformed``.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

__all__ = [
    "FINGERPRINT_VERSION",
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "InvalidPayloadError",
    "PayloadTooLarge",
    "canonical_json",
    "check_size",
    "derive_run_id",
    "dumps",
    "loads",
    "oversize",
    "submit_fingerprint",
]

FINGERPRINT_VERSION = "v1"
MAX_INT_DIGITS = 1000
MAX_DEPTH = 128
_RUN_NAMESPACE = uuid.UUID("6f1c2d0e-8a6b-4b55-9a53-3c1f4f0e2a10")


class InvalidPayloadError(ValueError):
    """Bytes that are not a JSON document."""


class PayloadTooLarge(InvalidPayloadError):  # noqa: N818 - the error type users see
    """A payload over the configured limit (``max_payload_bytes``): refused, never cut."""


def oversize(data: bytes, limit: int | None, what: str) -> str | None:
    """Why ``data`` is over ``limit`` bytes (None: within it, or no limit), for a refusal."""
    if limit is None or len(data) <= limit:
        return None
    return f"{what} is {len(data)} bytes, over the limit of {limit} bytes"


def check_size(data: bytes, limit: int | None, what: str) -> None:
    """Raise ``PayloadTooLarge`` if ``data`` is over ``limit`` bytes."""
    problem = oversize(data, limit, what)
    if problem is not None:
        raise PayloadTooLarge(problem)


def dumps(value: Any) -> bytes:
    """Canonical JSON: sorted keys, no insignificant whitespace, UTF-8."""
    try:
        return json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        ).encode()
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidPayloadError(f"not JSON-serializable: {exc}") from exc


def loads(raw: bytes) -> Any:
    """Parse a JSON document within the bounds above, or raise ``InvalidPayloadError``."""
    # Both bounds are checked only where they can be exceeded, so that the common small
    # document parses at the C decoder's speed: an integer of more digits than the
    # bound needs a longer document, and a deeper nesting needs more brackets.
    long_enough = len(raw) > MAX_INT_DIGITS
    try:
        value = json.loads(raw, parse_int=_bounded_int) if long_enough else json.loads(raw)
    except RecursionError as exc:
        raise InvalidPayloadError(f"JSON nested deeper than {MAX_DEPTH} levels") from exc
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise InvalidPayloadError(f"not a JSON document: {exc}") from exc
    if _brackets(raw) > MAX_DEPTH and _depth_exceeds(value, MAX_DEPTH):
        raise InvalidPayloadError(f"JSON nested deeper than {MAX_DEPTH} levels")
    return value


def _brackets(raw: bytes) -> int:
    """How many arrays and objects a document opens at most (strings may hold some)."""
    return raw.count(b"[") + raw.count(b"{")


def _bounded_int(literal: str) -> int:
    digits = len(literal) - literal.startswith("-")
    if digits > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {digits} digits (at most {MAX_INT_DIGITS})")
    return int(literal)


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest deeper than ``limit`` (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, dict | list):
            continue
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children)
    return False


def canonical_json(raw: bytes) -> bytes:
    """Re-encode JSON bytes canonically, so equal documents have equal bytes."""
    return dumps(loads(raw))


def derive_run_id(idempotency_key: str) -> str:
    """Run id for a keyed submit: the same key always lands on the same run and partition."""
    return str(uuid.uuid5(_RUN_NAMESPACE, "submit\x00" + idempotency_key))


def submit_fingerprint(pipeline: str, canonical_input: bytes) -> str:
    """Versioned fingerprint of the caller-controlled fields of a submit."""
    digest = hashlib.sha256()
    for part in (pipeline.encode(), canonical_input):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return f"{FINGERPRINT_VERSION}:{digest.hexdigest()}"
