"""Resume tokens: opaque, HMAC-SHA256-signed, bound to one interaction and epoch.

A token names the run, boundary, interaction and attempt epoch it was issued
for, signed with the deployment's secret. Only its SHA-256 digest is stored, so
a token from an earlier epoch of the same interaction no longer matches.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass

__all__ = ["TokenClaims", "digest", "parse", "sign", "verify"]

_VERSION = "v1"


@dataclass(frozen=True, slots=True)
class TokenClaims:
    run_id: str
    boundary: int
    interaction: str
    epoch: int


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: bytes, body: str) -> bytes:
    return hmac.new(secret, body.encode(), hashlib.sha256).digest()


def sign(secret: bytes, claims: TokenClaims) -> str:
    body = ".".join(
        (
            _VERSION,
            _b64(claims.run_id.encode()),
            str(claims.boundary),
            _b64(claims.interaction.encode()),
            str(claims.epoch),
        )
    )
    return f"{body}.{_b64(_mac(secret, body))}"


def parse(token: str) -> TokenClaims | None:
    """The claims a token states, unverified (for routing); None if it is not a token."""
    parts = token.split(".")
    if len(parts) != 6 or parts[0] != _VERSION:
        return None
    try:
        return TokenClaims(
            run_id=_unb64(parts[1]).decode(),
            boundary=int(parts[2]),
            interaction=_unb64(parts[3]).decode(),
            epoch=int(parts[4]),
        )
    except (ValueError, UnicodeDecodeError):
        return None


def verify(secret: bytes, token: str) -> TokenClaims | None:
    """The claims of a token signed with ``secret``; None for forged or altered tokens."""
    claims = parse(token)
    if claims is None:
        return None
    body, _, mac = token.rpartition(".")
    try:
        given = _unb64(mac)
    except ValueError:
        return None
    return claims if hmac.compare_digest(given, _mac(secret, body)) else None


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()
