"""The metrics census of a partition: runs waiting at a boundary by target, runs
whose attempt's outcome is Unknown, runs blocked on a pipeline version, and runs in
quarantine (their ids: /readyz lists them).

``RunCensus`` is counted once from the store's runs index when the partition is
assigned (bounded: ``count_from``) and then kept by the live loop's flushes, which
hand it each written run's state before and after. A scrape reads the counts and no
store at all.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable

from processor.model import waits
from processor.model.listing import blocked_parts, is_unknown, waiting_targets
from processor.model.state import RUNNING, RunState
from processor.store import keys
from processor.store.rocks import PartitionStore
from processor.store.run_row import state_of

__all__ = [
    "CENSUS_CAP",
    "RunCensus",
    "blocked_runs",
    "quarantined_runs",
    "unknown_attempts",
    "waiting_by_target",
]

#: Index rows the first count walks at most per partition for each count (README).
CENSUS_CAP = 100_000

_FAMILY = "index"
_CHUNK = 1000  # runs read per multi-get
#: The text a stored row of a run in the Unknown wait holds: its phase, as JSON.
_UNKNOWN_TEXT = f'"{waits.UNKNOWN.phase}"'.encode()


class RunCensus:
    """The counts of one partition; ``change`` and ``snapshot`` may run on different
    threads (the loop's and a scrape's)."""

    def __init__(
        self,
        waiting: Counter[str] | None = None,
        unknown: int = 0,
        blocked: Counter[tuple[str, int]] | None = None,
        quarantined: set[str] | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._waiting: Counter[str] = Counter() if waiting is None else waiting
        self._unknown = unknown
        self._blocked: Counter[tuple[str, int]] = Counter() if blocked is None else blocked
        self._quarantined: set[str] = set() if quarantined is None else quarantined

    @classmethod
    def count_from(cls, store: PartitionStore, cap: int = CENSUS_CAP) -> RunCensus:
        """The counts over the store's index, at most ``cap`` rows of each listing."""
        blocked = Counter((pipeline, version) for pipeline, version, _ in blocked_runs(store, cap))
        quarantined = set(quarantined_runs(store, cap))
        return cls(
            waiting_by_target(store, cap), unknown_attempts(store, cap), blocked, quarantined
        )

    def change(self, before: RunState | None, after: RunState | None) -> None:
        """Account one run written with the state ``after`` over ``before``."""
        left = waiting_targets(before) if before is not None else ()
        entered = waiting_targets(after) if after is not None else ()
        unknown = is_unknown(after) - is_unknown(before)
        unblocked, blocked = _blocked_on(before), _blocked_on(after)
        held = _quarantined(after) - _quarantined(before)
        if left == entered and not unknown and unblocked == blocked and not held:
            return
        with self._lock:
            if held and after is not None:
                (self._quarantined.add if held > 0 else self._quarantined.discard)(after.run_id)
            self._waiting.subtract(left)
            self._waiting.update(entered)
            self._unknown += unknown
            self._blocked.subtract(unblocked)
            self._blocked.update(blocked)

    def snapshot(self) -> tuple[dict[str, int], int]:
        """(runs waiting by target, runs with an Unknown attempt), never below zero."""
        with self._lock:
            waiting = {target: n for target, n in self._waiting.items() if n > 0}
            return waiting, max(0, self._unknown)

    def blocked(self) -> dict[tuple[str, int], int]:
        """Runs in phase ``definition_blocked`` by (pipeline, version)."""
        with self._lock:
            return {version: n for version, n in self._blocked.items() if n > 0}

    def quarantined(self) -> list[str]:
        """The ids of the partition's runs in quarantine, sorted."""
        with self._lock:
            return sorted(self._quarantined)


def _quarantined(state: RunState | None) -> int:
    return int(state is not None and state.quarantine is not None)


def _blocked_on(state: RunState | None) -> tuple[tuple[str, int], ...]:
    """The (pipeline, version) a ``definition_blocked`` run waits for, if it is one."""
    if state is None or state.terminal or waits.of(state) is not waits.DEFINITION_BLOCKED:
        return ()
    return ((state.pipeline, state.pipeline_version),)


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
    rows = [raw for raw in store.raw_runs(run_ids) if raw is not None and _UNKNOWN_TEXT in raw]
    return sum(is_unknown(state_of(raw)) for raw in rows)


def quarantined_runs(store: PartitionStore, cap: int) -> list[str]:
    """The ids of the store's quarantined runs, newest first, at most ``cap``."""
    prefix = keys.index_prefix("quarantined", ())
    found = []
    for seen, key in enumerate(store.keys_from(_FAMILY, prefix, prefix)):
        if seen >= cap:
            break
        found.append(keys.index_tail(key[len(prefix) :])[1])
    return found


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
