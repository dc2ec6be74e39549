"""Listing runs from the runs index (``model/listing.py``), merged across partitions.

A listing is a few ranges of index keys per partition (``store/keys.py``: newest
submitted first; one per status when it lists every status), merged; only the page's
runs are then read, with one multi-get per partition.
The runs family is never scanned. The cursor is the position of the last run shown,
so a page goes on after it whatever was inserted meanwhile.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import heapq
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, get_args

from processor.model.listing import waiting_targets
from processor.model.state import RUNNING, RunState, RunStatus
from processor.store import keys
from processor.store.rocks import PartitionStore, partition_of

__all__ = ["MAX_LIMIT", "RunPage", "RunQuery", "RunSummary", "list_runs", "waiting_runs"]

MAX_LIMIT = 1000
_FAMILY = "index"
_STATUSES: tuple[str, ...] = get_args(RunStatus)
_MAX_MS = 2**63 - 1  # a time is an Avro long (and must fit the index's 8-byte position)


@dataclass(frozen=True, slots=True)
class RunQuery:
    """What to list: every filter given must hold. ``since_ms`` (inclusive) and
    ``until_ms`` (exclusive) bound the submit time; ``target``: runs waiting at a
    boundary with an open interaction on that target."""

    status: str | None = None
    pipeline: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    target: str | None = None


@dataclass(frozen=True, slots=True)
class RunSummary:
    """One run of a listing."""

    run_id: str
    pipeline: str
    pipeline_version: int
    status: str
    phase: str
    submitted_ms: int
    updated_ms: int
    waiting_on: tuple[str, ...]
    partition: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "pipeline": self.pipeline,
            "pipeline_version": self.pipeline_version,
            "status": self.status,
            "phase": self.phase,
            "submitted_ms": self.submitted_ms,
            "updated_ms": self.updated_ms,
            "waiting_on": list(self.waiting_on),
            "partition": self.partition,
        }


@dataclass(frozen=True, slots=True)
class RunPage:
    """A page of runs, newest submitted first, and the cursor of the next (None: the last)."""

    runs: list[RunSummary] = field(default_factory=list)
    next_cursor: str | None = None


def list_runs(
    stores: Sequence[PartitionStore], query: RunQuery, cursor: str | None, limit: int
) -> RunPage:
    """One page of the runs ``query`` selects across ``stores``, after ``cursor`` (a
    previous page's ``next_cursor``; None: the first page).

    Raises:
        ValueError: a limit outside 1..1000, an unknown status, a negative time, or a
            cursor that is malformed or belongs to another query (the message says which).
    """
    _check(query, limit)
    prefixes = _prefixes(query)
    start = _start(query, cursor)
    if not prefixes or _empty_range(query):
        return RunPage()
    rows = heapq.merge(
        *(
            _positions(store, index, prefix, start, query.since_ms)
            for index, store in enumerate(stores)
            for prefix in prefixes
        )
    )
    found = [row for row, _ in zip(rows, range(limit + 1), strict=False)]
    page = found[:limit]
    runs = _summaries(stores, page)
    more = len(found) > limit
    return RunPage(runs, _cursor(query, page[-1][0]) if more else None)


def waiting_runs(stores: Sequence[PartitionStore], target: str | None) -> Iterator[tuple[int, str]]:
    """(partition, run id) of each run with an open interaction (on ``target``, if
    given), each once: read from the index alone."""
    prefix = keys.index_prefix("waiting", () if target is None else (target,))
    for index, store in enumerate(stores):
        partition = _partition(store, index)
        seen: set[str] = set()
        for key in store.keys_from(_FAMILY, prefix, prefix):
            run_id = _run_id_of(key, target)
            if run_id not in seen:
                seen.add(run_id)
                yield partition, run_id


def _run_id_of(key: bytes, target: str | None) -> str:
    """The run id of a ``waiting`` row; without a target, the row's own is skipped."""
    if target is not None:
        return keys.index_tail(key[len(keys.index_prefix("waiting", (target,))) :])[1]
    own = keys.decode_string_key(key[1:])
    return keys.index_tail(key[len(keys.index_prefix("waiting", (own,))) :])[1]


def _check(query: RunQuery, limit: int) -> None:
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be between 1 and {MAX_LIMIT}, not {limit}")
    if query.status is not None and query.status not in _STATUSES:
        raise ValueError(f"unknown status {query.status!r}; one of {', '.join(_STATUSES)}")
    for name in ("since_ms", "until_ms"):
        value = getattr(query, name)
        if value is not None and not 0 <= value <= _MAX_MS:
            raise ValueError(f"{name} must be a time in epoch milliseconds, not {value}")


def _prefixes(query: RunQuery) -> list[bytes]:
    """The index rows of the query's listing: one range each (none: it selects nothing)."""
    status, pipeline, target = query.status, query.pipeline, query.target
    if target is not None:
        if status not in (None, RUNNING):
            return []  # only running runs wait at a boundary
        if pipeline is None:
            return [keys.index_prefix("waiting", (target,))]
        return [keys.index_prefix("waiting_pipeline", (target, pipeline))]
    statuses = _STATUSES if status is None else (status,)
    if pipeline is None:
        return [keys.index_prefix("status", (s,)) for s in statuses]
    return [keys.index_prefix("pipeline_status", (pipeline, s)) for s in statuses]


def _empty_range(query: RunQuery) -> bool:
    """Whether the time range holds no millisecond at all."""
    if query.until_ms is None:
        return False
    return query.until_ms <= (query.since_ms or 0)


def _start(query: RunQuery, cursor: str | None) -> bytes:
    """The position the listing starts at: after the cursor's run, and not after
    ``until_ms`` (the runs submitted before it)."""
    start = b""
    if query.until_ms is not None:  # > 0: ``_empty_range``
        start = keys.index_position(query.until_ms - 1, "")
    if cursor is not None:
        submitted_ms, run_id = _decode_cursor(query, cursor)
        start = max(start, keys.index_position(submitted_ms, run_id) + b"\x00")
    return start


def _positions(
    store: PartitionStore, index: int, prefix: bytes, start: bytes, since_ms: int | None
) -> Iterator[tuple[bytes, int]]:
    """(position, store index) of the store's rows of the listing from ``start`` on,
    until one submitted before ``since_ms``."""
    cut = len(prefix)
    for key in store.keys_from(_FAMILY, prefix + start, prefix):
        position = key[cut:]
        if since_ms is not None and keys.index_tail(position)[0] < since_ms:
            return
        yield position, index


def _summaries(stores: Sequence[PartitionStore], page: list[tuple[bytes, int]]) -> list[RunSummary]:
    """The page's runs, in page order: one multi-get per partition."""
    by_store: dict[int, list[str]] = {}
    for position, index in page:
        by_store.setdefault(index, []).append(keys.index_tail(position)[1])
    states: dict[str, tuple[RunState, int]] = {}
    for index, run_ids in by_store.items():
        partition = _partition(stores[index], index)
        for state in stores[index].runs(run_ids):
            if state is not None:  # gone since the index was read: a store rebuilt meanwhile
                states[state.run_id] = (state, partition)
    summaries = []
    for position, _ in page:
        found = states.get(keys.index_tail(position)[1])
        if found is not None:
            summaries.append(_summary(*found))
    return summaries


def _summary(state: RunState, partition: int) -> RunSummary:
    return RunSummary(
        run_id=state.run_id,
        pipeline=state.pipeline,
        pipeline_version=state.pipeline_version,
        status=state.status,
        phase=state.phase,
        submitted_ms=state.submitted_ms,
        updated_ms=state.updated_ms,
        waiting_on=waiting_targets(state),
        partition=partition,
    )


def _partition(store: PartitionStore, index: int) -> int:
    found = partition_of(store.path)
    return index if found is None else found


# --- the cursor: the last run shown, and the query it belongs to --------------------------


def _query_digest(query: RunQuery) -> str:
    shown = json.dumps([query.status, query.pipeline, query.since_ms, query.until_ms, query.target])
    return hashlib.blake2b(shown.encode(), digest_size=6).hexdigest()


def _cursor(query: RunQuery, position: bytes) -> str:
    submitted_ms, run_id = keys.index_tail(position)
    raw = json.dumps({"q": _query_digest(query), "at": [submitted_ms, run_id]}).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _decode_cursor(query: RunQuery, cursor: str) -> tuple[int, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        value = json.loads(raw)
        submitted_ms, run_id = value["at"]
        digest = value["q"]
    except (binascii.Error, ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"invalid cursor {cursor[:40]!r}: not a cursor of a runs listing") from exc
    if not isinstance(submitted_ms, int) or not isinstance(run_id, str) or submitted_ms < 0:
        raise ValueError(f"invalid cursor {cursor[:40]!r}: not a cursor of a runs listing")
    if digest != _query_digest(query):
        raise ValueError("invalid cursor: it belongs to a listing with other filters")
    return submitted_ms, run_id
