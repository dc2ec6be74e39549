"""Reading a live partition store from another process (or thread) than its writer.

A reader is a RocksDB *secondary* instance of the store: it opens the writer's files
without locking them, keeps its own scratch files (its info log) in a directory of its
own under the state directory, and moves on to what the writer has written since with
``refresh`` (RocksDB's ``TryCatchUpWithPrimary``: it replays the writer's write-ahead
log and picks up new table files). Open once, refresh before each query: the CLI and
the HTTP API read the processor's stores this way while it runs.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from processor.store.rocks import PartitionStore

__all__ = ["open_reader", "readers_dir", "refresh"]


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
        return PartitionStore(path, secondary=scratch)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise


def refresh(store: PartitionStore) -> None:
    """Move a reader on to what the writer has written since it opened (or last refreshed)."""
    store.catch_up()
