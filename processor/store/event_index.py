"""The runs of one partition waiting for an event by correlation key: a range read of the
runs index rows ``event_key`` (``model/listing.py``), never a scan of the runs."""

from __future__ import annotations

from collections.abc import Iterable

from processor.model import event_waits
from processor.model.listing import open_targets
from processor.model.state import RunState
from processor.store import keys
from processor.store.rocks import PartitionStore

__all__ = ["candidates", "runs_waiting_on", "waits_on"]

_FAMILY = "index"


def runs_waiting_on(store: PartitionStore, event: str, key: str) -> list[str]:
    """The ids of the runs of this store with an open wait for ``event`` keyed by ``key``,
    newest submitted first (the rows read are the runs found: nothing else is read)."""
    prefix = keys.index_prefix("event_key", (event, key))
    return [
        keys.index_tail(row[len(prefix) :])[1] for row in store.keys_from(_FAMILY, prefix, prefix)
    ]


def waits_on(state: RunState | None, event: str, key: str) -> bool:
    """Whether the run has an open wait for ``event`` keyed by ``key`` now."""
    return state is not None and (event, key) in event_waits.keyed(open_targets(state))


def candidates(
    store: PartitionStore, staged: Iterable[RunState], event: str, key: str
) -> list[str]:
    """The runs that may wait on (event, key): the committed index rows, and the runs
    staged in the open batch that wait on it (registered since the last commit)."""
    found = dict.fromkeys(runs_waiting_on(store, event, key))
    found.update((state.run_id, None) for state in staged if waits_on(state, event, key))
    return list(found)
