"""The one root of every error the processor raises on purpose."""

from __future__ import annotations

__all__ = [
    "AppendConflictError",
    "ConfigurationError",
    "FactDecodeError",
    "FencedError",
    "ProcessorError",
    "SessionLostError",
    "TransportError",
    "UnknownPipelineError",
]


class ProcessorError(Exception):
    """Root of all errors raised deliberately by this package."""


class ConfigurationError(ProcessorError):
    """Settings, topics or pipelines are inconsistent; the processor refuses to start."""


class FactDecodeError(ProcessorError):
    """Bytes that are not a value this processor can decode; keeps the raw bytes."""

    def __init__(self, reason: str, raw: bytes | None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.raw = raw


class AppendConflictError(ProcessorError):
    """New facts were appended against a stale expected run version."""


class TransportError(ProcessorError):
    """The log (Kafka or embedded) failed in a way the caller may retry."""


class FencedError(TransportError):
    """Another instance owns the partitions now; this instance must not commit."""


class SessionLostError(TransportError):
    """The session is unusable (a client call hung past its deadline); open a new one."""


class UnknownPipelineError(ProcessorError):
    """A pipeline name (or version) that the loaded application does not define."""
