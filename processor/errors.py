"""The one root of every error the processor raises on purpose."""

from __future__ import annotations

__all__ = [
    "AppendConflictError",
    "ConfigurationError",
    "FactDecodeError",
    "FencedError",
    "ProcessorError",
    "RegistryUnavailableError",
    "SchemaRefusedError",
    "SessionLostError",
    "StoreFormatError",
    "TransportError",
    "UnknownPipelineError",
    "UnknownRunError",
    "WaitTimeoutError",
]


class ProcessorError(Exception):
    """Root of all errors raised deliberately by this package."""


class ConfigurationError(ProcessorError):
    """Settings, topics or pipelines are inconsistent; the processor refuses to start."""


class FactDecodeError(ProcessorError):
    """Bytes that are not a value this processor can decode; keeps the raw bytes.

    ``reason`` is the refusal reason users grep for (``malformed``,
    ``unknown_schema``, ``wrong_schema``); ``detail`` says what was wrong.
    """

    def __init__(self, reason: str, detail: str, raw: bytes | None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.raw = raw


class AppendConflictError(ProcessorError):
    """New facts were appended against a stale expected run version."""


class StoreFormatError(ProcessorError):
    """A partition store written in another format, by another release."""

    def __init__(self, path: object, found: str) -> None:
        super().__init__(
            f"the store at {path} is in another format ({found}); "
            "the processor rebuilds it from runs.facts when it starts"
        )
        self.path = path


class TransportError(ProcessorError):
    """The log (Kafka or embedded) failed in a way the caller may retry."""


class FencedError(TransportError):
    """Another instance owns the partitions now; this instance must not commit."""


class SessionLostError(TransportError):
    """The session is unusable (a client call hung past its deadline); open a new one."""


class RegistryUnavailableError(TransportError):
    """The Schema Registry did not answer; retried like any log failure."""


class SchemaRefusedError(ConfigurationError):
    """The Schema Registry refused a schema (an incompatible change); keeps its answer."""


class UnknownPipelineError(ProcessorError):
    """A pipeline name (or version) that the loaded application does not define."""


class UnknownRunError(ProcessorError, LookupError):
    """No run has this id in the deployment's runs.facts."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run {run_id}")
        self.run_id = run_id


class WaitTimeoutError(ProcessorError, TimeoutError):
    """A run did not end within the time a caller waited for it (it may still end)."""

    def __init__(self, run_id: str, timeout_s: float, status: str) -> None:
        super().__init__(f"run {run_id} did not end within {timeout_s}s (still {status})")
        self.run_id = run_id
        self.timeout_s = timeout_s
        self.status = status
