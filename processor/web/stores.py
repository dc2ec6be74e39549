"""The API's readers of the partition stores the processor writes (secondary instances).

Opened once per partition (a store that appears later is opened when it does),
caught up with the writer before each query (``store/readers.py``). One query at
a time uses them: a refresh must not run while another thread reads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from processor.errors import StoreFormatError
from processor.store.readers import open_reader, refresh
from processor.store.rocks import PartitionStore, partition_of

__all__ = ["StoreReaders"]

logger = logging.getLogger(__name__)


class StoreReaders:
    """Secondary instances of every partition store under ``state_dir``."""

    def __init__(self, state_dir: Path) -> None:
        self._state_dir = state_dir
        self._stores: dict[int, PartitionStore] = {}
        self._lock = threading.Lock()

    @contextmanager
    def fresh(self) -> Iterator[list[PartitionStore]]:
        """The stores, caught up with their writer, in partition order, for the block."""
        with self._lock:
            self._open_new()
            for store in self._stores.values():
                refresh(store)
            yield [self._stores[p] for p in sorted(self._stores)]

    def _open_new(self) -> None:
        if not self._state_dir.is_dir():
            return
        for path in self._state_dir.iterdir():
            partition = partition_of(path)
            if partition is None or partition in self._stores:
                continue
            try:
                store = open_reader(path)
            except StoreFormatError as exc:  # the processor rebuilds it when it starts
                logger.info("not reading %s: %s", path, exc)
                continue
            if store is not None:
                self._stores[partition] = store

    def close(self) -> None:
        with self._lock:
            for store in self._stores.values():
                store.close()
            self._stores.clear()
