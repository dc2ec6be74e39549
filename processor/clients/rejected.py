"""Read-side helpers for operators: the shape of a record of admission.rejected.

Pages of the topic are read by ``processor.clients.pages.read_topic_page``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from processor.errors import FactDecodeError
from processor.facts.codec import codec
from processor.facts.models import Rejected

__all__ = ["rejected_dict"]


def rejected_dict(value: bytes | None) -> dict[str, Any]:
    """One record of admission.rejected as ``processor rejected`` shows it."""
    try:
        item = codec().decode_as(value, Rejected)
    except FactDecodeError as exc:
        return {
            "reason": "undecodable",
            "detail": f"{exc.reason}: {exc.detail}",
            "source": "?",
            "rejected_ms": 0,
            "time": "-",
            "run_id": None,
            "original_value": None,
        }
    return {
        "reason": item.reason,
        "detail": item.detail,
        "source": f"{item.source_topic}/{item.source_partition}@{item.source_offset}",
        "source_topic": item.source_topic,
        "source_partition": item.source_partition,
        "source_offset": item.source_offset,
        "run_id": item.run_id,
        "rejected_ms": item.rejected_ms,
        "time": datetime.fromtimestamp(item.rejected_ms / 1000, UTC).isoformat(
            timespec="milliseconds"
        ),
        "original_value": None if item.original_value is None else item.original_value.hex(),
    }
