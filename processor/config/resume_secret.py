"""The resume-token secret: configured, or (embedded log only) generated and kept."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from processor.config.settings import Settings
from processor.errors import ConfigurationError

__all__ = ["resume_secret"]

_FILE = "resume-secret"


def resume_secret(settings: Settings) -> bytes:
    """The HMAC key for resume tokens.

    On Kafka it must be configured (every processor instance must share it); the
    embedded log generates one on first use and keeps it beside the log.
    """
    if settings.resume_secret is not None:
        value = settings.resume_secret.get_secret_value().encode()
        if len(value) < 16:
            raise ConfigurationError("PROCESSOR_RESUME_SECRET must be at least 16 characters")
        return value
    if settings.broker is not None:
        raise ConfigurationError(
            "PROCESSOR_RESUME_SECRET is required with a Kafka broker: every processor instance "
            "must sign and verify resume tokens with the same secret"
        )
    return _kept_secret(settings.data_dir / _FILE)


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
