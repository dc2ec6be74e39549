"""What a reader without the right to resume tokens is shown: the same, tokens redacted.

A resume token answers its await, so whatever shows one is shown whole only to
whom may answer (over HTTP: the bearer token; README, "HTTP API and metrics").
Everyone else gets ``redacted(...)``: each token's MAC starred
(``tokens.redact``), its claims (run, boundary, interaction, epoch) still readable.
A record of admission.rejected or runs.dlq is redacted in its raw bytes, before it
is shaped, so its original bytes (shown in hex) and what is decoded from them are.
"""

from __future__ import annotations

from typing import Any

from processor.clients.pages import record_dict
from processor.facts import tokens

__all__ = ["redacted", "redacted_record_dict"]


def redacted(value: Any) -> Any:
    """A JSON value (dicts, lists, strings, numbers) with every token in it redacted."""
    if isinstance(value, str):
        return tokens.redact(value)
    if isinstance(value, dict):
        return {redacted(key): redacted(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [redacted(item) for item in value]
    return value


def redacted_record_dict(value: bytes | None) -> dict[str, Any]:
    """``record_dict`` of a record with every token in its bytes redacted."""
    return record_dict(None if value is None else tokens.redact_bytes(value))
