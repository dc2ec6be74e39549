"""One partition's RocksDB projections (rocksdict), written in atomic WriteBatches.

Column families:
  runs       run id -> RunState as a flat row (``store/run_row.py``: JSON, fields at
             their default left out)
  history    (run id, first seq) -> a chunk of the run's facts, one per write
             (``store/history.py``): for ``history`` and conditional append
  due        (due ms, run id, kind, segment, generation) -> b"" : timers by due time
  index      (kind, parts, inverted submitted ms, run id) -> b"" : the runs index
             (``model/listing.py``, ``store/keys.py``): listings, newest first
  meta       b"facts_offset" -> next runs.facts offset reflected here

The live loop writes with RocksDB's write-ahead log. Catch-up writes without it
(``write(batch, wal=False)``), as a bulk load, then ``persist``s; with
``atomic_flush`` every column family reaches disk at the same batch, so a store
killed mid catch-up reopens at a consistent earlier batch and catches up from there.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

from rocksdict import (
    AccessType,
    BlockBasedOptions,
    Cache,
    Checkpoint,
    DBCompressionType,
    Options,
    Rdict,
    WriteBatch,
    WriteOptions,
)

from processor.errors import StoreFormatError
from processor.model.due import DueEntry
from processor.model.listing import IndexEntry
from processor.model.state import RunState
from processor.store import keys
from processor.store.history import chunk_fact_keys, chunk_facts, encode_chunk
from processor.store.run_row import row_json, state_of, states_of

__all__ = [
    "COLUMN_FAMILIES",
    "PartitionStore",
    "StoreBatch",
    "open_existing",
    "open_store",
    "partition_of",
    "store_path",
    "stored_facts_offset",
]

logger = logging.getLogger(__name__)

COLUMN_FAMILIES = ("runs", "history", "due", "index", "meta")
_RdictKey = str | int | float | bytes | bool
_FACTS_OFFSET = b"facts_offset"
_FORMAT_VERSION = b"format_version"
#: 5: the runs index family; 4: no claims family (idempotency is the run id derived
#: from the key, and the run's fingerprint); 3: runs without their default fields,
#: history facts without their run id; 2: history in chunks of facts with their keys
#: (1: a row per fact, a fact_keys family).
FORMAT_VERSION = 5


# Memory bounds of one store (one partition). The column families share one block
# cache, and their memtables together flush at ``_DB_WRITE_BUFFER_MB`` (RocksDB's
# db_write_buffer_size); before, each of the 7 option sets had its own 16 MiB cache and
# 6 families could hold 2 x 8 MiB of memtables each: up to ~210 MiB per partition.
_DB_WRITE_BUFFER_MB = 24


def _options(cache: Cache, *, point_lookups: bool = False) -> Options:
    """Options of the database or of one column family. ``point_lookups``: Bloom filters
    in the memtable and the SST files, so a get of a key that is not there (a new run,
    every run of a replay) skips the search."""
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_max_open_files(256)
    opts.set_keep_log_file_num(2)
    opts.set_write_buffer_size(8 * 1024 * 1024)
    opts.set_max_write_buffer_number(2)
    opts.set_atomic_flush(True)  # every family flushed at one batch: see the module doc
    # Uncompressed, as Kafka Streams keeps its state stores: a store is a cache of the
    # log, rebuilt from it, and compressing it (Snappy, RocksDB's default, or LZ4) was
    # a fifth of a replay's instructions. It costs disk: ~3x LZ4's (BENCHMARKS.md).
    opts.set_compression_type(DBCompressionType.none())
    table = BlockBasedOptions()
    table.set_block_cache(cache)
    if point_lookups:
        table.set_bloom_filter(10, False)
        opts.set_memtable_prefix_bloom_ratio(0.1)
        opts.set_memtable_whole_key_filtering(True)
    opts.set_block_based_table_factory(table)
    return opts


class PartitionStore:
    """Projections of the runs of one partition, on disk."""

    def __init__(
        self,
        path: Path,
        *,
        read_only: bool = False,
        cache_mb: int = 16,
        secondary: Path | None = None,
    ) -> None:
        """Open (or create) the store at ``path``. ``read_only``: a snapshot as of now;
        ``secondary``: a RocksDB secondary instance (its scratch files in that
        directory) that ``catch_up`` moves on to what the writer has written since."""
        self.path = path
        _check_families(path)
        read_only = read_only or secondary is not None
        if not read_only:  # the writer owns the scratch left by a crash in ``persist``
            shutil.rmtree(_checkpoint_path(path), ignore_errors=True)
        path.mkdir(parents=True, exist_ok=True)
        cache = Cache(cache_mb * 1024 * 1024)  # shared by every column family
        opts = _options(cache)
        opts.set_db_write_buffer_size(_DB_WRITE_BUFFER_MB * 1024 * 1024)
        families = {name: _options(cache, point_lookups=name == "runs") for name in COLUMN_FAMILIES}
        if secondary is not None:
            # A secondary instance keeps every file open: RocksDB wants no limit there.
            opts.set_max_open_files(-1)
            access = AccessType.secondary(str(secondary))
        elif read_only:
            access = AccessType.read_only()
        else:
            access = AccessType.read_write()
        self._db = Rdict(str(path), options=opts, column_families=families, access_type=access)
        self._cf = {name: self._db.get_column_family(name) for name in COLUMN_FAMILIES}
        self._handles = {name: self._db.get_column_family_handle(name) for name in COLUMN_FAMILIES}
        self._unpersisted = False  # written without the WAL since the last persist
        self._secondary = secondary
        found = self._cf["meta"].get(_FORMAT_VERSION)
        if found is None and not read_only:
            self._cf["meta"][_FORMAT_VERSION] = keys.u64(FORMAT_VERSION)
        elif found is not None and int.from_bytes(found, "big") != FORMAT_VERSION:
            self.close()
            raise StoreFormatError(path, f"format {int.from_bytes(found, 'big')}")

    # --- reads ---------------------------------------------------------------------------

    def run(self, run_id: str) -> RunState | None:
        raw = self._cf["runs"].get(keys.run_key(run_id))
        return None if raw is None else state_of(raw)

    def runs(self, run_ids: Sequence[str]) -> list[RunState | None]:
        """``run`` of each id, in order, with one multi-get instead of a get per run."""
        return states_of(self.raw_runs(run_ids))

    def raw_runs(self, run_ids: Sequence[str]) -> list[bytes | None]:
        """The stored JSON of each run (None if absent), in order: one multi-get."""
        return self.raw_runs_at([keys.run_key(run_id) for run_id in run_ids])

    def raw_runs_at(self, run_keys: list[bytes]) -> list[bytes | None]:
        """``raw_runs`` for keys the caller built (``keys.run_key``): the compiled
        fold's, which builds them faster than Python does."""
        if not run_keys:
            return []
        # rocksdict types a multi-get's keys as a list of any key type (invariant).
        found = self._cf["runs"].get(cast("list[_RdictKey]", run_keys))
        assert found is not None  # a multi-get answers a list, None per missing key
        return list(found)

    def fact_keys(self, run_id: str) -> set[str]:
        """The fact keys in the run's journal (for conditional append)."""
        return {fact_key for chunk in self._chunks(run_id) for fact_key in chunk_fact_keys(chunk)}

    def holds_no_runs(self) -> bool:
        """Whether no run has been written here yet."""
        it = self._cf["runs"].iter()
        it.seek_to_first()
        return not it.valid()

    def facts_offset(self) -> int:
        raw = self._cf["meta"].get(_FACTS_OFFSET)
        return 0 if raw is None else int.from_bytes(raw, "big")

    def due(self, until_ms: int, limit: int) -> list[DueEntry]:
        """Due rows with due time at or before ``until_ms``, earliest first."""
        found: list[DueEntry] = []
        it = self._cf["due"].iter()
        it.seek_to_first()
        while it.valid() and len(found) < limit:
            entry = keys.decode_due(it.key())
            if entry.due_ms > until_ms:
                break
            found.append(entry)
            it.next()
        return found

    def next_due_ms(self, after_ms: int) -> int | None:
        """The due time of the earliest due row after ``after_ms`` (None: there is none)."""
        it = self._cf["due"].iter()
        it.seek(keys.due_from(after_ms + 1))
        return keys.decode_due(it.key()).due_ms if it.valid() else None

    def keys_from(self, family: str, start: bytes, prefix: bytes) -> Iterator[bytes]:
        """The keys of ``family`` from ``start`` on (in key order) while they begin with
        ``prefix``: one listing of the runs index."""
        it = self._cf[family].iter()
        it.seek(start)
        while it.valid():
            key = it.key()
            if not key.startswith(prefix):
                return
            yield key
            it.next()

    def catch_up(self) -> None:
        """A secondary instance: move on to what the writer has written since."""
        self._db.try_catch_up_with_primary()

    def history(self, run_id: str) -> list[bytes]:
        """The encoded facts of one run, in sequence order."""
        return [fact for chunk in self._chunks(run_id) for fact in chunk_facts(run_id, chunk)]

    def _chunks(self, run_id: str) -> Iterator[bytes]:
        prefix = keys.history_prefix(run_id)
        it = self._cf["history"].iter()
        it.seek(prefix)
        while it.valid() and it.key().startswith(prefix) and len(it.key()) == len(prefix) + 8:
            yield it.value()
            it.next()

    def histories(self) -> Iterator[tuple[str, list[bytes]]]:
        """(run id, the run's encoded facts) of every run, in key order: the history
        family's content, whatever its chunking (for verify)."""
        run_key, run_id, facts = b"", "", list[bytes]()
        for key, chunk in self.items("history"):
            if key[:-8] != run_key:
                if facts:
                    yield run_id, facts
                run_key, run_id, facts = key[:-8], keys.decode_string_key(key), []
            facts.extend(chunk_facts(run_id, chunk))
        if facts:
            yield run_id, facts

    def items(self, family: str) -> Iterator[tuple[bytes, bytes]]:
        """Every row of one column family in key order (for verify)."""
        it = self._cf[family].iter()
        it.seek_to_first()
        while it.valid():
            yield it.key(), it.value()
            it.next()

    def count(self, family: str) -> int:
        """The number of rows of one column family (walks the keys only)."""
        it = self._cf[family].iter()
        it.seek_to_first()
        rows = 0
        while it.valid():
            rows += 1
            it.next()
        return rows

    # --- writes --------------------------------------------------------------------------

    def batch(self) -> StoreBatch:
        return StoreBatch(self._handles)

    def write(self, batch: StoreBatch, *, wal: bool = True) -> None:
        """Apply ``batch`` atomically. ``wal=False`` (catch-up, a bulk load) skips the
        write-ahead log: the batch is durable only after ``persist`` (or a flush)."""
        if wal:
            self._db.write(batch.raw)
            return
        self._db.write(batch.raw, _NO_WAL)
        self._unpersisted = True

    def persist(self) -> None:
        """Flush every column family to disk in one atomic flush.

        rocksdict's ``flush`` flushes one column family; one after another, a crash
        between two would leave families at different batches. RocksDB flushes all
        of them atomically (``atomic_flush``) before it takes a checkpoint, so persist
        takes one (hard links, next to the store) and removes it.
        """
        scratch = _checkpoint_path(self.path)
        shutil.rmtree(scratch, ignore_errors=True)
        Checkpoint(self._db).create_checkpoint(str(scratch))
        shutil.rmtree(scratch, ignore_errors=True)
        self._unpersisted = False

    def close(self) -> None:
        if self._unpersisted:
            self.persist()
        # Column-family handles keep the database alive: drop them before closing.
        self._cf.clear()
        self._handles.clear()
        self._db.close()
        if self._secondary is not None:  # a secondary's own files are scratch
            shutil.rmtree(self._secondary, ignore_errors=True)


_NO_WAL = WriteOptions()
# A property at run time; rocksdict's type stubs declare it a method.
_NO_WAL.disable_wal = True  # type: ignore[method-assign,assignment]


def _checkpoint_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.persisting")


def _check_families(path: Path) -> None:
    """Refuse a store with other column families than this format's (format 1 had a
    ``fact_keys`` family, formats 1 to 3 a ``claims`` family; RocksDB will not open a
    store without all of its families)."""
    if not (path / "CURRENT").exists():
        return
    found = set(Rdict.list_cf(str(path))) - {"default"}
    if found != set(COLUMN_FAMILIES):
        raise StoreFormatError(path, "column families " + ", ".join(sorted(found)))


def open_store(path: Path) -> PartitionStore:
    """The store at ``path`` for writing. A store in another format (an older release's)
    is removed first: projections are rebuilt from runs.facts, never migrated."""
    try:
        return PartitionStore(path)
    except StoreFormatError as exc:
        logger.warning("%s; removing it, it will be rebuilt from runs.facts", exc)
        shutil.rmtree(path)
        return PartitionStore(path)


def store_path(state_dir: Path, partition: int) -> Path:
    """Where the store of ``partition`` lives under a state directory."""
    return state_dir / f"p{partition:04d}"


def partition_of(path: Path) -> int | None:
    """The partition whose store ``store_path`` puts at ``path`` (None: not one of those)."""
    name = path.name
    return int(name[1:]) if name.startswith("p") and name[1:].isdigit() else None


def open_existing(path: Path) -> PartitionStore | None:
    """The store at ``path`` opened read-only (a consistent snapshot), or None if none is there.

    Safe while another process (the processor) has it open for writing.
    """
    return PartitionStore(path, read_only=True) if (path / "CURRENT").exists() else None


def stored_facts_offset(path: Path) -> int:
    """The facts offset the store at ``path`` has applied (0 if there is no store)."""
    try:
        store = open_existing(path)
    except StoreFormatError:
        return 0  # rebuilt from offset 0 when it is opened for writing
    if store is None:
        return 0
    try:
        return store.facts_offset()
    finally:
        store.close()


class StoreBatch:
    """Projection changes written atomically, together with the facts offset."""

    def __init__(self, handles: dict[str, Any]) -> None:
        self.raw = WriteBatch(raw_mode=True)
        self._h = handles

    def put_run(self, state: RunState) -> None:
        self.raw.put(keys.run_key(state.run_id), row_json(state), self._h["runs"])

    def put_history(self, run_id: str, first_seq: int, facts: Iterable[bytes]) -> None:
        """One history chunk: the run's encoded facts from ``first_seq`` on."""
        key = keys.history_key(run_id, first_seq)
        self.raw.put(key, encode_chunk(run_id, facts), self._h["history"])

    def writer(self, families: Sequence[str]) -> tuple[Any, Any, tuple[Any, ...]]:
        """This batch's raw ``put(key, value, family)`` and ``delete(key, family)``, and
        the handles of ``families``: for a writer that builds rows itself (the
        compiled fold)."""
        return self.raw.put, self.raw.delete, tuple(self._h[name] for name in families)

    def put_due(self, entry: DueEntry) -> None:
        self.raw.put(keys.due_key(entry), b"", self._h["due"])

    def delete_due(self, entry: DueEntry) -> None:
        self.raw.delete(keys.due_key(entry), self._h["due"])

    def put_index(self, entry: IndexEntry) -> None:
        self.raw.put(keys.index_key(entry), b"", self._h["index"])

    def delete_index(self, entry: IndexEntry) -> None:
        self.raw.delete(keys.index_key(entry), self._h["index"])

    def set_facts_offset(self, offset: int) -> None:
        self.raw.put(_FACTS_OFFSET, keys.u64(offset), self._h["meta"])
