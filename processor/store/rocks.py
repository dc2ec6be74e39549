"""One partition's RocksDB projections (rocksdict), written in atomic WriteBatches.

Column families:
  runs       run id -> RunState (JSON)
  history    (run id, seq) -> the fact's encoded bytes, for ``history`` and replay checks
  fact_keys  (run id, fact key) -> seq, for conditional append
  due        (due ms, run id, kind, segment, generation) -> b"" : timers by due time
  claims     idempotency key -> {run_id, fingerprint}
  meta       b"facts_offset" -> next runs.facts offset reflected here
"""

from __future__ import annotations

import functools
import json
import logging
import struct
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from rocksdict import AccessType, BlockBasedOptions, Cache, Options, Rdict, WriteBatch

from processor.facts.models import FactHeader
from processor.model.due import DueEntry
from processor.model.state import RunState
from processor.store import keys

__all__ = [
    "COLUMN_FAMILIES",
    "PartitionStore",
    "StoreBatch",
    "open_existing",
    "store_path",
    "stored_facts_offset",
]

logger = logging.getLogger(__name__)

COLUMN_FAMILIES = ("runs", "history", "fact_keys", "due", "claims", "meta")
_FACTS_OFFSET = b"facts_offset"
_FORMAT_VERSION = b"format_version"
FORMAT_VERSION = 1


_U64 = struct.Struct(">Q")
# Fact keys come from a small vocabulary ("submitted", "step/0/completed", ...).
_string_key_cached = functools.lru_cache(maxsize=4096)(keys.string_key)


def _composes_keys() -> bool:
    """Whether history and fact-key keys are (run prefix + u64 seq) and (run prefix +
    string key): the layout ``StoreBatch.put_facts`` builds without calling ``keys``."""
    for run_id, seq, fact_key in (("r", 1, "k"), ("run-\u00e9", 2**40 + 7, "step/3/completed")):
        prefix = keys.history_prefix(run_id)
        if keys.history_key(run_id, seq) != prefix + _U64.pack(seq):
            return False
        if keys.fact_key_key(run_id, fact_key) != prefix + keys.string_key(fact_key):
            return False
        if keys.u64(seq) != _U64.pack(seq):
            return False
    return True


_COMPOSED_KEYS = _composes_keys()


# Memory bounds of one store (one partition). The column families share one block
# cache, and their memtables together flush at ``_DB_WRITE_BUFFER_MB`` (RocksDB's
# db_write_buffer_size); before, each of the 7 option sets had its own 16 MiB cache and
# 6 families could hold 2 x 8 MiB of memtables each: up to ~210 MiB per partition.
_DB_WRITE_BUFFER_MB = 24


def _options(cache: Cache) -> Options:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_max_open_files(256)
    opts.set_keep_log_file_num(2)
    opts.set_write_buffer_size(8 * 1024 * 1024)
    opts.set_max_write_buffer_number(2)
    table = BlockBasedOptions()
    table.set_block_cache(cache)
    opts.set_block_based_table_factory(table)
    return opts


class PartitionStore:
    """Projections of the runs of one partition, on disk."""

    def __init__(self, path: Path, *, read_only: bool = False, cache_mb: int = 16) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        cache = Cache(cache_mb * 1024 * 1024)  # shared by every column family
        opts = _options(cache)
        opts.set_db_write_buffer_size(_DB_WRITE_BUFFER_MB * 1024 * 1024)
        families = {name: _options(cache) for name in COLUMN_FAMILIES}
        access = AccessType.read_only() if read_only else AccessType.read_write()
        self._db = Rdict(str(path), options=opts, column_families=families, access_type=access)
        self._cf = {name: self._db.get_column_family(name) for name in COLUMN_FAMILIES}
        self._handles = {name: self._db.get_column_family_handle(name) for name in COLUMN_FAMILIES}
        if not read_only and self._cf["meta"].get(_FORMAT_VERSION) is None:
            self._cf["meta"][_FORMAT_VERSION] = keys.u64(FORMAT_VERSION)

    # --- reads ---------------------------------------------------------------------------

    def run(self, run_id: str) -> RunState | None:
        raw = self._cf["runs"].get(keys.run_key(run_id))
        return None if raw is None else RunState.model_validate_json(raw)

    def runs(self, run_ids: Sequence[str]) -> list[RunState | None]:
        """``run`` of each id, in order, with one multi-get instead of a get per run."""
        validate = RunState.model_validate_json
        return [None if raw is None else validate(raw) for raw in self.raw_runs(run_ids)]

    def raw_runs(self, run_ids: Sequence[str]) -> list[bytes | None]:
        """The stored JSON of each run (None if absent), in order: one multi-get."""
        if not run_ids:
            return []
        found = self._cf["runs"].get([keys.run_key(run_id) for run_id in run_ids])
        assert found is not None  # a multi-get answers a list, None per missing key
        return list(found)

    def has_fact_key(self, run_id: str, fact_key: str) -> bool:
        return self._cf["fact_keys"].get(keys.fact_key_key(run_id, fact_key)) is not None

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

    def history(self, run_id: str) -> list[bytes]:
        """The encoded facts of one run, in sequence order."""
        prefix = keys.history_prefix(run_id)
        it = self._cf["history"].iter()
        it.seek(prefix)
        facts = []
        while it.valid() and it.key().startswith(prefix) and len(it.key()) == len(prefix) + 8:
            facts.append(it.value())
            it.next()
        return facts

    def claim(self, idempotency_key: str) -> dict[str, Any] | None:
        raw = self._cf["claims"].get(keys.string_key(idempotency_key))
        return None if raw is None else dict(json.loads(raw))

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

    def write(self, batch: StoreBatch) -> None:
        self._db.write(batch.raw)

    def close(self) -> None:
        # Column-family handles keep the database alive: drop them before closing.
        self._cf.clear()
        self._handles.clear()
        self._db.close()


def store_path(state_dir: Path, partition: int) -> Path:
    """Where the store of ``partition`` lives under a state directory."""
    return state_dir / f"p{partition:04d}"


def open_existing(path: Path) -> PartitionStore | None:
    """The store at ``path`` opened read-only (a consistent snapshot), or None if none is there.

    Safe while another process (the processor) has it open for writing.
    """
    return PartitionStore(path, read_only=True) if (path / "CURRENT").exists() else None


def stored_facts_offset(path: Path) -> int:
    """The facts offset the store at ``path`` has applied (0 if there is no store)."""
    store = open_existing(path)
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
        self.raw.put(keys.run_key(state.run_id), _run_json(state), self._h["runs"])

    def put_fact(self, run_id: str, seq: int, fact_key: str, encoded: bytes) -> None:
        self.raw.put(keys.history_key(run_id, seq), encoded, self._h["history"])
        self.raw.put(keys.fact_key_key(run_id, fact_key), keys.u64(seq), self._h["fact_keys"])

    def put_facts(self, facts: Iterable[tuple[str, int, str, bytes]]) -> None:
        """``put_fact`` of each (run id, seq, fact key, encoded), the same rows, faster.

        The run id's key prefix is built once per run and the encoded fact keys are
        memoized; ``_COMPOSED_KEYS`` proves at import that this composes the same
        bytes as ``keys.history_key`` and ``keys.fact_key_key``.
        """
        if not _COMPOSED_KEYS:
            for run_id, seq, fact_key, encoded in facts:
                self.put_fact(run_id, seq, fact_key, encoded)
            return
        put = self.raw.put
        history, fact_keys = self._h["history"], self._h["fact_keys"]
        prefixes: dict[str, bytes] = {}
        string_key, pack = _string_key_cached, _U64.pack
        for run_id, seq, fact_key, encoded in facts:
            prefix = prefixes.get(run_id)
            if prefix is None:
                prefix = prefixes[run_id] = keys.history_prefix(run_id)
            packed = pack(seq)
            put(prefix + packed, encoded, history)
            put(prefix + string_key(fact_key), packed, fact_keys)

    def put_staged_facts(self, staged: Iterable[tuple[FactHeader, bytes]]) -> None:
        """``put_facts`` of each (fact, encoded bytes): the same rows."""
        self.put_facts((fact.run_id, fact.seq, fact.fact_key, encoded) for fact, encoded in staged)

    def writer(self, families: Sequence[str]) -> tuple[Any, Any, tuple[Any, ...]]:
        """This batch's raw ``put(key, value, family)`` and ``delete(key, family)``, and
        the handles of ``families``: for a writer that builds rows itself (the
        compiled fold)."""
        return self.raw.put, self.raw.delete, tuple(self._h[name] for name in families)

    def put_due(self, entry: DueEntry) -> None:
        self.raw.put(keys.due_key(entry), b"", self._h["due"])

    def delete_due(self, entry: DueEntry) -> None:
        self.raw.delete(keys.due_key(entry), self._h["due"])

    def put_claim(self, idempotency_key: str, run_id: str, fingerprint: str | None) -> None:
        value = json.dumps({"run_id": run_id, "fingerprint": fingerprint}).encode()
        self.raw.put(keys.string_key(idempotency_key), value, self._h["claims"])

    def set_facts_offset(self, offset: int) -> None:
        self.raw.put(_FACTS_OFFSET, keys.u64(offset), self._h["meta"])


def _run_json(state: RunState) -> bytes:
    """``state.model_dump_json().encode()``: the same bytes, one call into pydantic-core."""
    return RunState.__pydantic_serializer__.to_json(state)
