"""Read-side helpers for operators: what is in admission.rejected."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from processor.errors import FactDecodeError
from processor.facts.codec import codec
from processor.facts.models import Rejected
from processor.facts.topics import TopicName
from processor.transport.base import TopicPartition
from processor.transport.deployment import Deployment

__all__ = ["rejected_records"]


def rejected_records(deployment: Deployment) -> list[dict[str, Any]]:
    """Every record of admission.rejected, oldest first."""
    topic = deployment.topology.name(TopicName.REJECTED)
    reader = deployment.transport.reader()
    rows: list[dict[str, Any]] = []
    try:
        for partition in range(deployment.topology.partitions):
            for records in reader.read(TopicPartition(topic, partition), 0):
                rows.extend(_row(r.value) for r in records)
    finally:
        reader.close()
    return sorted(rows, key=lambda r: r["rejected_ms"])


def _row(value: bytes | None) -> dict[str, Any]:
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
