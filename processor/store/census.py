"""Counts over a partition store's runs index, for the metrics scrape (bounded).

Each count walks the keys of one listing of the index (never the runs family)
and stops after ``cap`` rows, so a scrape costs at most that much per partition.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from processor.model.listing import blocked_parts
from processor.model.state import RUNNING
from processor.store import keys
from processor.store.rocks import PartitionStore
from processor.store.run_row import state_of

__all__ = ["blocked_runs", "unknown_attempts", "waiting_by_target"]

_FAMILY = "index"
_CHUNK = 1000  # runs read per multi-get


def waiting_by_target(store: PartitionStore, cap: int) -> Counter[str]:
    """Runs with an open interaction, by target (a run waiting on two targets counts
    once for each), over at most ``cap`` index rows."""
    prefix = keys.index_prefix("waiting", ())
    counts: Counter[str] = Counter()
    for seen, key in enumerate(store.keys_from(_FAMILY, prefix, prefix)):
        if seen >= cap:
            break
        counts[keys.decode_string_key(key[len(prefix) :])] += 1
    return counts


def unknown_attempts(store: PartitionStore, cap: int) -> int:
    """Running runs whose attempt's outcome is unknown (waiting for an operator), over at
    most ``cap`` running runs, newest first."""
    prefix = keys.index_prefix("status", (RUNNING,))
    found, chunk = 0, list[str]()
    for seen, key in enumerate(store.keys_from(_FAMILY, prefix, prefix)):
        if seen >= cap:
            break
        chunk.append(keys.index_tail(key[len(prefix) :])[1])
        if len(chunk) == _CHUNK:
            found += _unknown_in(store, chunk)
            chunk = []
    return found + _unknown_in(store, chunk)


def _unknown_in(store: PartitionStore, run_ids: list[str]) -> int:
    # Parse only the rows that can be one: a row names its phase, and JSON escapes
    # every quote inside a string value, so a row without this text is not unknown.
    rows = [raw for raw in store.raw_runs(run_ids) if raw is not None and b'"unknown"' in raw]
    return sum(state_of(raw).phase == "unknown" for raw in rows)


def blocked_runs(
    store: PartitionStore, cap: int, versions: Iterable[tuple[str, int]] | None = None
) -> list[tuple[str, int, str]]:
    """(pipeline, version, run id) of the store's ``definition_blocked`` runs, of
    ``versions`` only if given, at most ``cap`` of each version (``cap`` in all without
    ``versions``), read from the runs index alone (the runs family is not touched)."""
    if versions is None:
        return _blocked_from(store, keys.index_prefix("blocked", ()), cap)
    found: list[tuple[str, int, str]] = []
    for pipeline, version in sorted(versions):
        prefix = keys.index_prefix("blocked", blocked_parts(pipeline, version))
        found += _blocked_from(store, prefix, cap)
    return found


def _blocked_from(store: PartitionStore, prefix: bytes, cap: int) -> list[tuple[str, int, str]]:
    found: list[tuple[str, int, str]] = []
    start = len(keys.index_prefix("blocked", ()))
    for key in store.keys_from(_FAMILY, prefix, prefix):
        if len(found) >= cap:
            break
        pipeline, rest = _string_at(key, start)
        version, rest = _string_at(key, rest)
        found.append((pipeline, int(version), keys.index_tail(key[rest:])[1]))
    return found


def _string_at(key: bytes, at: int) -> tuple[str, int]:
    """The length-prefixed string at ``at`` of ``key``, and where it ends."""
    text = keys.decode_string_key(key[at:])
    return text, at + 4 + len(text.encode())
