"""The resume keys: named HMAC secrets; the first signs, every one verifies.

Tokens and handoff signatures name the key that made them, so a deployment can
rotate its secret: add the new key first, keep the old one until nothing it
signed is still waiting, then remove it (whatever it signed is refused from then on).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["DEFAULT_KEY_ID", "KEY_ID_PATTERN", "KeyRing"]

# Key ids travel inside tokens and signatures, whose fields are dot-separated.
KEY_ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,32}")
# The id of a single configured key (PROCESSOR_RESUME_SECRET or the generated one).
DEFAULT_KEY_ID = "default"


@dataclass(frozen=True, slots=True)
class KeyRing:
    """Named secrets in order: ``keys[0]`` signs, any of them verifies what it signed."""

    keys: tuple[tuple[str, bytes], ...]

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("a key ring needs at least one key")
        ids = [key_id for key_id, _ in self.keys]
        for key_id in ids:
            if KEY_ID_PATTERN.fullmatch(key_id) is None:
                raise ValueError(f"key id {key_id!r} must be 1-32 of A-Z a-z 0-9 _ -")
        if len(set(ids)) != len(ids):
            raise ValueError(f"key ids must be unique, got {ids}")

    @staticmethod
    def single(secret: bytes, key_id: str = DEFAULT_KEY_ID) -> KeyRing:
        """A ring of one key."""
        return KeyRing(((key_id, secret),))

    @property
    def signing(self) -> tuple[str, bytes]:
        """The key id and secret that sign new tokens and handoffs."""
        return self.keys[0]

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(key_id for key_id, _ in self.keys)

    def get(self, key_id: str) -> bytes | None:
        """The secret named ``key_id``; None once it was removed (or never configured)."""
        for known, secret in self.keys:
            if known == key_id:
                return secret
        return None

    def secrets(self) -> tuple[bytes, ...]:
        return tuple(secret for _, secret in self.keys)

    def __repr__(self) -> str:  # never print the secrets
        return f"KeyRing(ids={list(self.ids)})"
