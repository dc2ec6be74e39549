"""User payloads (run input, step output) are JSON carried as canonical bytes."""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

__all__ = [
    "FINGERPRINT_VERSION",
    "InvalidPayloadError",
    "canonical_json",
    "derive_run_id",
    "dumps",
    "loads",
    "submit_fingerprint",
]

FINGERPRINT_VERSION = "v1"
_RUN_NAMESPACE = uuid.UUID("6f1c2d0e-8a6b-4b55-9a53-3c1f4f0e2a10")


class InvalidPayloadError(ValueError):
    """Bytes that are not a JSON document."""


def dumps(value: Any) -> bytes:
    """Canonical JSON: sorted keys, no insignificant whitespace, UTF-8."""
    try:
        return json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        ).encode()
    except (TypeError, ValueError) as exc:
        raise InvalidPayloadError(f"not JSON-serializable: {exc}") from exc


def loads(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidPayloadError(f"not a JSON document: {exc}") from exc


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
