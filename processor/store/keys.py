"""Collision-free structured keys: length-prefixed strings, big-endian integers.

Big-endian fixed-width integers sort numerically under RocksDB's bytewise order,
so the due-work index iterates in due-time order and history in sequence order, and
the runs index (its submit time inverted) newest submitted first.
"""

from __future__ import annotations

import struct

from processor.model.due import DueEntry, TimerKind
from processor.model.listing import IndexEntry, IndexKind

__all__ = [
    "decode_due",
    "decode_string_key",
    "due_key",
    "history_key",
    "history_prefix",
    "index_key",
    "index_position",
    "index_prefix",
    "index_tail",
    "run_key",
    "string_key",
    "u64",
]

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_DUE_TAIL = struct.Struct(">BII")
_KINDS: dict[int, TimerKind] = {
    1: "attempt_timeout",
    2: "retry",
    3: "interaction_timeout",
    4: "publication",
    5: "run_deadline",
    6: "compensation_timeout",
    7: "compensation_retry",
    9: "heartbeat_timeout",
    10: "schedule_to_start_timeout",
    11: "sleep",
}
_KIND_CODES: dict[str, int] = {kind: code for code, kind in _KINDS.items()}
_INDEX_KINDS: dict[IndexKind, int] = {
    "status": 1,
    "pipeline_status": 2,
    "waiting": 3,
    "waiting_pipeline": 4,
    "blocked": 5,
    "quarantined": 6,
    "event_key": 7,
}
_U64_MAX = 2**64 - 1


def string_key(value: str) -> bytes:
    raw = value.encode()
    return _U32.pack(len(raw)) + raw


def decode_string_key(key: bytes) -> str:
    """The string ``string_key`` encoded at the start of ``key``."""
    length = _U32.unpack_from(key, 0)[0]
    return key[4 : 4 + length].decode()


def u64(value: int) -> bytes:
    return _U64.pack(value)


def run_key(run_id: str) -> bytes:
    return string_key(run_id)


def history_prefix(run_id: str) -> bytes:
    return string_key(run_id)


def history_key(run_id: str, seq: int) -> bytes:
    return string_key(run_id) + _U64.pack(seq)


def due_key(entry: DueEntry) -> bytes:
    tail = _DUE_TAIL.pack(_KIND_CODES[entry.kind], entry.scope, entry.ordinal)
    return _U64.pack(entry.due_ms) + string_key(entry.run_id) + tail


def due_from(due_ms: int) -> bytes:
    """Where the due rows of ``due_ms`` and later begin (rows sort by due time first)."""
    return _U64.pack(due_ms)


def decode_due(key: bytes) -> DueEntry:
    due_ms = _U64.unpack_from(key, 0)[0]
    length = _U32.unpack_from(key, 8)[0]
    run_id = key[12 : 12 + length].decode()
    kind, scope, ordinal = _DUE_TAIL.unpack_from(key, 12 + length)
    return DueEntry(due_ms, run_id, _KINDS[kind], scope, ordinal)


def index_prefix(kind: IndexKind, parts: tuple[str, ...]) -> bytes:
    """The common start of the runs-index rows of one kind and parts (one listing)."""
    return bytes([_INDEX_KINDS[kind]]) + b"".join(string_key(part) for part in parts)


def index_position(submitted_ms: int, run_id: str) -> bytes:
    """Where a run sorts within a listing: its submit time inverted (newest first),
    then its run id. The run id ends the key, so it needs no length: left raw, runs
    submitted in the same millisecond sort by run id as strings do."""
    return _U64.pack(_U64_MAX - max(submitted_ms, 0)) + run_id.encode()


def index_key(entry: IndexEntry) -> bytes:
    """(kind code, parts length-prefixed, inverted submit ms, run id)."""
    return index_prefix(entry.kind, entry.parts) + index_position(entry.submitted_ms, entry.run_id)


def index_tail(position: bytes) -> tuple[int, str]:
    """(submitted ms, run id) of an ``index_position`` (a key without its prefix)."""
    inverted = _U64.unpack_from(position, 0)[0]
    return _U64_MAX - inverted, position[8:].decode()
