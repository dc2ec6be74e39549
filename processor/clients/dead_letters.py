"""Read-side helpers for operators: the shape of a record of runs.dlq."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from processor.errors import FactDecodeError
from processor.facts.codec import codec
from processor.facts.models import DeadLetter
from processor.facts.payload import InvalidPayloadError, loads

__all__ = ["dead_letter_dict"]


def dead_letter_dict(value: bytes | None) -> dict[str, Any]:
    """One record of runs.dlq: the DeadLetter's fields, its input as JSON and its time."""
    try:
        item = codec().decode_as(value, DeadLetter)
    except FactDecodeError as exc:
        return {"run_id": None, "error": f"undecodable: {exc.reason}: {exc.detail}"}
    shown: dict[str, Any] = dict(item.__dict__)
    shown["input"] = _json_or_hex(item.input)
    shown["time"] = datetime.fromtimestamp(item.failed_ms / 1000, UTC).isoformat(
        timespec="milliseconds"
    )
    return shown


def _json_or_hex(raw: bytes) -> Any:
    try:
        return loads(raw)
    except InvalidPayloadError:
        return raw.hex()
