"""The metrics census of a partition: runs waiting at a boundary by target, and runs
whose attempt's outcome is Unknown.

``RunCensus`` is counted once from the store's runs index when the partition is
assigned (bounded: ``count_from``) and then kept by the live loop's flushes, which
hand it each written run's state before and after. A scrape reads the counts and no
store at all.
"""

from __future__ import annotations

import threading
from collections import Counter

from processor.model.listing import is_unknown, waiting_targets
from processor.model.state import RUNNING, RunState
from processor.store import keys
from processor.store.rocks import PartitionStore
from processor.store.run_row import state_of

__all__ = ["CENSUS_CAP", "RunCensus", "unknown_attempts", "waiting_by_target"]

#: Index rows the first count walks at most per partition for each count (README).
CENSUS_CAP = 100_000

_FAMILY = "index"
_CHUNK = 1000  # runs read per multi-get


class RunCensus:
    """The counts of one partition; ``change`` and ``snapshot`` may run on different
    threads (the loop's and a scrape's)."""

    def __init__(self, waiting: Counter[str] | None = None, unknown: int = 0) -> None:
        self._lock = threading.Lock()
        self._waiting: Counter[str] = Counter() if waiting is None else waiting
        self._unknown = unknown

    @classmethod
    def count_from(cls, store: PartitionStore, cap: int = CENSUS_CAP) -> RunCensus:
        """The counts over the store's index, at most ``cap`` rows of each listing."""
        return cls(waiting_by_target(store, cap), unknown_attempts(store, cap))

    def change(self, before: RunState | None, after: RunState | None) -> None:
        """Account one run written with the state ``after`` over ``before``."""
        left = waiting_targets(before) if before is not None else ()
        entered = waiting_targets(after) if after is not None else ()
        unknown = is_unknown(after) - is_unknown(before)
        if left == entered and not unknown:
            return
        with self._lock:
            self._waiting.subtract(left)
            self._waiting.update(entered)
            self._unknown += unknown

    def snapshot(self) -> tuple[dict[str, int], int]:
        """(runs waiting by target, runs with an Unknown attempt), never below zero."""
        with self._lock:
            waiting = {target: n for target, n in self._waiting.items() if n > 0}
            return waiting, max(0, self._unknown)


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
    return sum(is_unknown(state_of(raw)) for raw in rows)
