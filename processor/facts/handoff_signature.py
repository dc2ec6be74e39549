"""Checkpoint handoff signatures: HMAC-SHA256 over everything a handoff decides.

A handoff on ``boundary.checkpoints`` starts a pipeline or resumes a waiting
run, so only the processor may write one. It signs the source run, checkpoint
name, target, idempotency key (a ``pipeline:`` target's run id derives from
it), content type and the SHA-256 digest of the payload, each length-prefixed,
with the key ring's signing key. The signature is ``v1.<key id>.<mac>``
(base64url MAC without padding).
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from processor.facts.keyring import KeyRing
from processor.facts.models import CheckpointHandoff

__all__ = ["problem", "sign", "signed"]

_VERSION = "v1"
# Separates handoff MACs from token MACs made with the same secret.
_DOMAIN = b"processor/checkpoint-handoff/v1"


def _mac(secret: bytes, handoff: CheckpointHandoff) -> str:
    mac = hmac.new(secret, digestmod=hashlib.sha256)
    for part in (
        _DOMAIN,
        handoff.source_run_id.encode(),
        handoff.checkpoint.encode(),
        handoff.target.encode(),
        handoff.idempotency_key.encode(),
        handoff.content_type.encode(),
        hashlib.sha256(handoff.payload).digest(),
    ):
        mac.update(len(part).to_bytes(8, "big"))
        mac.update(part)
    return base64.urlsafe_b64encode(mac.digest()).rstrip(b"=").decode()


def sign(keys: KeyRing, handoff: CheckpointHandoff) -> str:
    """The signature of ``handoff`` (its own ``signature`` field is not covered)."""
    kid, secret = keys.signing
    return f"{_VERSION}.{kid}.{_mac(secret, handoff)}"


def signed(keys: KeyRing, handoff: CheckpointHandoff) -> CheckpointHandoff:
    """``handoff`` carrying its signature."""
    return handoff.model_copy(update={"signature": sign(keys, handoff)})


def problem(keys: KeyRing, handoff: CheckpointHandoff) -> str | None:
    """Why ``handoff`` is not authentic (unsigned, unknown key, forged, altered), or None."""
    if not handoff.signature:
        return "checkpoint handoff is not signed"
    parts = handoff.signature.split(".")
    if len(parts) != 3 or parts[0] != _VERSION:
        return "checkpoint handoff signature is not a v1 signature"
    secret = keys.get(parts[1])
    if secret is None:
        return f"checkpoint handoff is signed with key {parts[1]!r}, which is not configured"
    if not hmac.compare_digest(parts[2], _mac(secret, handoff)):
        return "checkpoint handoff signature does not match: forged or altered"
    return None
