"""The runs of one partition waiting for an event by correlation key: a range read of the
runs index rows ``event_key`` (``model/listing.py``), never a scan of the runs."""

from __future__ import annotations

from processor.store import keys
from processor.store.rocks import PartitionStore

__all__ = ["runs_waiting_on"]

_FAMILY = "index"


def runs_waiting_on(store: PartitionStore, event: str, key: str) -> list[str]:
    """The ids of the runs of this store with an open wait for ``event`` keyed by ``key``,
    newest submitted first (the rows read are the runs found: nothing else is read)."""
    prefix = keys.index_prefix("event_key", (event, key))
    return [
        keys.index_tail(row[len(prefix) :])[1] for row in store.keys_from(_FAMILY, prefix, prefix)
    ]
