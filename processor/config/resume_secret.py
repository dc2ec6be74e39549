"""The resume keys: configured, or (embedded log only) generated and kept.

``PROCESSOR_RESUME_SECRETS`` holds several named keys for rotation, as
comma-separated ``kid:secret`` pairs (key ids: 1-32 of ``A-Z a-z 0-9 _ -``;
secrets: at least 16 characters, no commas); the first signs new tokens and
handoffs, every one verifies. ``PROCESSOR_RESUME_SECRET`` is one key with the
id ``default``, as is the secret the embedded log generates. To rotate away
from it: ``PROCESSOR_RESUME_SECRETS=new:<new secret>,default:<old secret>``;
once nothing signed with the old key waits any more, drop ``default:...``.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

from processor.config.settings import Settings
from processor.errors import ConfigurationError

__all__ = ["DEFAULT_KEY_ID", "parse_resume_secrets", "resume_keys"]

_FILE = "resume-secret"
_MIN_LENGTH = 16
# Mirrors processor.facts.keyring (config may not import facts): ids travel in tokens.
_KEY_ID = re.compile(r"[A-Za-z0-9_-]{1,32}")
DEFAULT_KEY_ID = "default"

ResumeKeys = tuple[tuple[str, bytes], ...]


def resume_keys(settings: Settings) -> ResumeKeys:
    """The (key id, secret) pairs of resume tokens and handoff signatures, signing key first.

    On Kafka they must be configured (every processor instance must share them);
    the embedded log generates one key on first use and keeps it beside the log.
    """
    if settings.resume_secrets is not None and settings.resume_secret is not None:
        raise ConfigurationError(
            "set PROCESSOR_RESUME_SECRETS or PROCESSOR_RESUME_SECRET, not both (the single "
            f"secret is the key {DEFAULT_KEY_ID!r}: list it in PROCESSOR_RESUME_SECRETS)"
        )
    if settings.resume_secrets is not None:
        return parse_resume_secrets(settings.resume_secrets.get_secret_value())
    if settings.resume_secret is not None:
        value = settings.resume_secret.get_secret_value().encode()
        if len(value) < _MIN_LENGTH:
            raise ConfigurationError("PROCESSOR_RESUME_SECRET must be at least 16 characters")
        return ((DEFAULT_KEY_ID, value),)
    if settings.broker is not None:
        raise ConfigurationError(
            "PROCESSOR_RESUME_SECRET (or PROCESSOR_RESUME_SECRETS) is required with a Kafka "
            "broker: every processor instance must sign and verify resume tokens with the "
            "same secret"
        )
    return ((DEFAULT_KEY_ID, _kept_secret(settings.data_dir / _FILE)),)


def parse_resume_secrets(text: str) -> ResumeKeys:
    """``kid:secret[,kid:secret...]`` as pairs, in order; a clear error for anything else.

    The error names the offending key id or position, never a secret.
    """
    pairs: list[tuple[str, bytes]] = []
    for position, item in enumerate(text.split(","), start=1):
        kid, colon, secret = item.strip().partition(":")
        if not colon or _KEY_ID.fullmatch(kid) is None:
            raise ConfigurationError(
                f"PROCESSOR_RESUME_SECRETS entry {position} must be kid:secret with a key id "
                "of 1-32 characters A-Z a-z 0-9 _ -"
            )
        if len(secret) < _MIN_LENGTH:
            raise ConfigurationError(
                f"PROCESSOR_RESUME_SECRETS key {kid!r} must be at least 16 characters"
            )
        if any(kid == known for known, _ in pairs):
            raise ConfigurationError(f"PROCESSOR_RESUME_SECRETS names key {kid!r} twice")
        pairs.append((kid, secret.encode()))
    return tuple(pairs)


def _kept_secret(path: Path) -> bytes:
    if path.exists():
        return path.read_bytes().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    value = secrets.token_hex(32).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, value)
    finally:
        os.close(fd)
    return value
