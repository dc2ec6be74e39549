"""Reading a live partition store from another process (or thread) than its writer.

A reader is a RocksDB *secondary* instance of the store: it opens the writer's files
without locking them, keeps its own scratch files (its info log) in a directory of its
own under the state directory, and moves on to what the writer has written since with
``refresh`` (RocksDB's ``TryCatchUpWithPrimary``: it replays the writer's write-ahead
log and picks up new table files). Open once, refresh before each query: the CLI and
the HTTP API read the processor's stores this way while it runs, those of the
partitions it owns (``store/ownership.py``: a revoked partition's store stays on disk,
stale).

A store the processor removed and rebuilt (a store of an older format, a lost one
restored) is another database in the same place: its reader would go on showing the
old one, so ``refresh`` raises ``StoreReplacedError`` and ``LocalStores`` reopens it.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import weakref
from collections.abc import Collection, Iterable
from pathlib import Path

from processor.errors import ProcessorError, StoreFormatError
from processor.store.rocks import PartitionStore, partition_of

__all__ = [
    "LocalStores",
    "StoreReplacedError",
    "open_reader",
    "open_readers",
    "readers_dir",
    "refresh",
    "store_partitions",
]

logger = logging.getLogger(__name__)


class StoreReplacedError(ProcessorError):
    """The store a reader follows was removed, or replaced by another: open a new reader."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"the store at {path} was removed or rebuilt since it was opened")
        self.path = path


def readers_dir(path: Path) -> Path:
    """Where the readers of the store at ``path`` keep their scratch directories."""
    return path.parent / ".readers"


def open_reader(path: Path) -> PartitionStore | None:
    """A secondary instance of the store at ``path`` (None if there is no store there).

    Safe while the processor writes the store. Its scratch directory is removed when it
    is closed. Raises ``StoreFormatError`` for a store of another format (one the
    processor rebuilds when it starts).
    """
    if not (path / "CURRENT").exists():
        return None
    scratch_root = readers_dir(path)
    scratch_root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f"{path.name}.", dir=scratch_root))
    try:
        reader = PartitionStore(path, secondary=scratch)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    _OPENED_AS[reader] = _identity(path)
    return reader


#: The database each reader opened: RocksDB's IDENTITY, a new one for a new database.
_OPENED_AS: weakref.WeakKeyDictionary[PartitionStore, bytes | None] = weakref.WeakKeyDictionary()


def _identity(path: Path) -> bytes | None:
    try:
        return (path / "IDENTITY").read_bytes()
    except FileNotFoundError:
        return None


#: Each reader's view of its writer's files when it last caught up (``_files``).
_CAUGHT_UP_AT: weakref.WeakKeyDictionary[PartitionStore, frozenset[tuple[str, int, int]]] = (
    weakref.WeakKeyDictionary()
)


def refresh(store: PartitionStore) -> None:
    """Move a reader on to what the writer has written since it opened (or last refreshed).

    A catch-up costs milliseconds even when nothing changed (it reads the writer's
    manifest and write-ahead log); it is skipped when none of those files changed.

    Raises:
        StoreReplacedError: the store was removed or rebuilt since the reader opened.
    """
    opened_as = _OPENED_AS.get(store)
    if opened_as is not None and _identity(store.path) != opened_as:
        raise StoreReplacedError(store.path)
    files = _files(store.path)
    if _CAUGHT_UP_AT.get(store) == files:
        return
    store.catch_up()
    _CAUGHT_UP_AT[store] = files


def _files(path: Path) -> frozenset[tuple[str, int, int]]:
    """(name, size, modification time) of the files a catch-up reads: the write-ahead
    logs, the manifest and CURRENT. Every write, flush or compaction changes one."""
    found = set()
    with os.scandir(path) as entries:
        for entry in entries:
            name = entry.name
            if name.endswith(".log") or name.startswith("MANIFEST-") or name == "CURRENT":
                stat = entry.stat()
                found.add((name, stat.st_size, stat.st_mtime_ns))
    return frozenset(found)


def open_readers(
    state_dir: Path, partitions: Collection[int] | None = None
) -> list[PartitionStore]:
    """A reader of every partition store under ``state_dir`` (of ``partitions`` only, if
    given: see ``store/ownership.py``), in partition order."""
    readers: list[PartitionStore] = []
    try:
        for path in _store_paths(state_dir, partitions):
            reader = open_reader(path)
            if reader is not None:
                readers.append(reader)
    except BaseException:
        for reader in readers:
            reader.close()
        raise
    return readers


class LocalStores:
    """Readers of the partition stores under a state directory, kept open: ``refresh``
    catches them up, opens the stores that appeared since (a partition assigned later)
    and closes those no longer asked for (a partition revoked). For a server that
    answers many queries; not thread-safe."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self._readers: dict[Path, PartitionStore] = {}

    def refresh(self, partitions: Collection[int] | None = None) -> list[PartitionStore]:
        """The readers of ``partitions`` (None: of every store), caught up with their
        writers, in partition order."""
        wanted = _store_paths(self.state_dir, partitions)
        for path, reader in list(self._readers.items()):
            if path not in wanted or not _refreshed(reader):
                reader.close()  # a replaced store is reopened below, if it is there again
                del self._readers[path]
        for path in wanted:
            if path not in self._readers:
                try:
                    opened = open_reader(path)
                except StoreFormatError as exc:  # the processor rebuilds it when it opens it
                    logger.debug("not reading %s: %s", path, exc)
                    continue
                if opened is not None:
                    self._readers[path] = opened
        return [self._readers[path] for path in sorted(self._readers, key=_partition_key)]

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()


def store_partitions(stores: Iterable[PartitionStore]) -> list[int]:
    """The partitions of ``stores``, as listings say which partitions they cover."""
    return [partition for store in stores if (partition := partition_of(store.path)) is not None]


def _refreshed(reader: PartitionStore) -> bool:
    """Catch ``reader`` up; False if its store was replaced (open a new reader)."""
    try:
        refresh(reader)
    except StoreReplacedError:
        return False
    return True


def _store_paths(state_dir: Path, partitions: Collection[int] | None = None) -> list[Path]:
    """The partition stores' directories under ``state_dir`` (of ``partitions``, if
    given), in partition order."""
    if not state_dir.is_dir():
        return []
    found = [
        path
        for path in state_dir.iterdir()
        if path.is_dir()
        and (partition := partition_of(path)) is not None
        and (partitions is None or partition in partitions)
    ]
    return sorted(found, key=_partition_key)


def _partition_key(path: Path) -> int:
    return partition_of(path) or 0
