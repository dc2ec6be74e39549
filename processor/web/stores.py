"""The API's readers of the partition stores the processor writes (secondary instances).

``LocalStores`` (``store/readers.py``) keeps a reader of each store open, catches
them up before each query, opens the stores that appear later and reopens a store
the processor rebuilt. The API's request threads share it, one query at a time: a
catch-up must not run while another thread reads.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path

from processor.store.readers import LocalStores
from processor.store.rocks import PartitionStore

__all__ = ["StoreReaders"]


class StoreReaders:
    """Secondary instances of every partition store under ``state_dir``, thread-safe."""

    def __init__(self, state_dir: Path) -> None:
        self._stores = LocalStores(state_dir)
        self._lock = threading.Lock()

    @contextmanager
    def fresh(self, partitions: Collection[int] | None = None) -> Iterator[list[PartitionStore]]:
        """The stores (of ``partitions``; None: all), caught up with their writer, in
        partition order, for the block."""
        with self._lock:
            yield self._stores.refresh(partitions)

    def close(self) -> None:
        with self._lock:
            self._stores.close()
