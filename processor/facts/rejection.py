"""The one way to build a ``Rejected`` record for admission.rejected."""

from __future__ import annotations

from typing import Protocol

from processor.facts.models import Rejected

__all__ = ["MAX_DETAIL", "RefusedRecord", "rejected"]

#: Characters of a refusal's detail kept: a detail may quote the input (a 600 kB
#: pipeline name), and the rejection already carries the input's bytes.
MAX_DETAIL = 2000


class RefusedRecord(Protocol):
    """Where a refused input was read (``transport.base.Record`` is one)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...


def rejected(
    record: RefusedRecord,
    reason: str,
    detail: str,
    now_ms: int,
    *,
    run_id: str | None = None,
) -> Rejected:
    """The rejection of ``record``, keeping its key and bytes so nothing is lost."""
    return Rejected(
        reason=reason,
        detail=detail if len(detail) <= MAX_DETAIL else detail[: MAX_DETAIL - 3] + "...",
        source_topic=record.topic,
        source_partition=record.partition,
        source_offset=record.offset,
        original_key=record.key,
        original_value=record.value,
        run_id=run_id,
        rejected_ms=now_ms,
    )
