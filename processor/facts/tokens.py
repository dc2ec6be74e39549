"""Resume tokens: opaque, HMAC-SHA256-signed, bound to one interaction and epoch.

A token names the run, boundary, interaction and attempt epoch it was issued
for, signed with one key of the deployment's key ring. Only its SHA-256 digest
is stored, so a token from an earlier epoch of the same interaction no longer
matches.

Formats (dot-separated; base64url without padding for the strings and the MAC,
which covers every field before it):

- ``v2.<key id>.<run id>.<boundary>.<interaction>.<epoch>.<mac>``: issued now;
  verified only with the key it names, so a token of a removed key is refused.
- ``v1.<run id>.<boundary>.<interaction>.<epoch>.<mac>``: issued before keys had
  ids; verified with any key of the ring, so it keeps working as long as the
  single key it was made with is still configured.

``redact`` and ``redact_bytes`` star the MAC of anything token-shaped in a text
or in raw bytes (a record's original bytes): the claims stay readable, the token
no longer answers anything, and the bytes keep their length (an Avro record
still decodes).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass

from processor.facts.keyring import KeyRing

__all__ = [
    "TokenClaims",
    "digest",
    "key_id",
    "parse",
    "redact",
    "redact_bytes",
    "sign",
    "verify",
]

_V1 = "v1"
_V2 = "v2"

#: A v1 or v2 token: its claims (group 1) and its MAC, base64url of 32 bytes (group 2).
_SHAPE = (
    r"(v1\.[A-Za-z0-9_-]*\.[0-9]+\.[A-Za-z0-9_-]*\.[0-9]+"
    r"|v2\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*\.[0-9]+\.[A-Za-z0-9_-]*\.[0-9]+)"
    r"\.([A-Za-z0-9_-]{43})"
)
_TOKEN_TEXT = re.compile(_SHAPE)
_TOKEN_BYTES = re.compile(_SHAPE.encode())


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


def _mac(secret: bytes, body: str) -> str:
    return _b64(hmac.new(secret, body.encode(), hashlib.sha256).digest())


def sign(keys: KeyRing, claims: TokenClaims) -> str:
    """A v2 token for ``claims``, signed with the ring's signing key."""
    kid, secret = keys.signing
    body = ".".join(
        (
            _V2,
            kid,
            _b64(claims.run_id.encode()),
            str(claims.boundary),
            _b64(claims.interaction.encode()),
            str(claims.epoch),
        )
    )
    return f"{body}.{_mac(secret, body)}"


def _claim_fields(token: str) -> list[str] | None:
    parts = token.split(".")
    if len(parts) == 6 and parts[0] == _V1:
        return parts[1:5]
    if len(parts) == 7 and parts[0] == _V2:
        return parts[2:6]
    return None


def parse(token: str) -> TokenClaims | None:
    """The claims a token states, unverified (for routing); None if it is not a token."""
    fields = _claim_fields(token)
    if fields is None:
        return None
    try:
        return TokenClaims(
            run_id=_unb64(fields[0]).decode(),
            boundary=int(fields[1]),
            interaction=_unb64(fields[2]).decode(),
            epoch=int(fields[3]),
        )
    except (ValueError, UnicodeDecodeError):
        return None


def key_id(token: str) -> str | None:
    """The id of the key a v2 token says signed it; None for a v1 token or a non-token."""
    parts = token.split(".")
    return parts[1] if len(parts) == 7 and parts[0] == _V2 else None


def verify(keys: KeyRing, token: str) -> TokenClaims | None:
    """The claims of a token signed with a key of ``keys``; None for forged or altered
    tokens, and for tokens of a key that is not (or no longer) in the ring."""
    claims = parse(token)
    if claims is None:
        return None
    body, _, mac = token.rpartition(".")
    kid = key_id(token)
    if kid is None:
        candidates = keys.secrets()  # a v1 token: made with the one key there was
    else:
        secret = keys.get(kid)
        candidates = () if secret is None else (secret,)
    # The MAC is compared as text: a non-canonical base64 spelling is an alteration.
    if any(hmac.compare_digest(mac, _mac(secret, body)) for secret in candidates):
        return claims
    return None


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def redact(text: str) -> str:
    """``text`` with the MAC of every token in it replaced by ``*`` (as many)."""
    return _TOKEN_TEXT.sub(lambda m: f"{m[1]}.{'*' * len(m[2])}", text)


def redact_bytes(raw: bytes) -> bytes:
    """``raw`` with the MAC of every token in it replaced by ``*``: the same length."""
    return _TOKEN_BYTES.sub(lambda m: m[1] + b"." + b"*" * len(m[2]), raw)
