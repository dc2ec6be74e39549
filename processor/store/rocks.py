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

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rocksdict import AccessType, BlockBasedOptions, Cache, Options, Rdict, WriteBatch

from processor.model.due import DueEntry
from processor.model.state import RunState
from processor.store import keys

__all__ = ["COLUMN_FAMILIES", "PartitionStore"]

logger = logging.getLogger(__name__)

COLUMN_FAMILIES = ("runs", "history", "fact_keys", "due", "claims", "meta")
_FACTS_OFFSET = b"facts_offset"
_FORMAT_VERSION = b"format_version"
FORMAT_VERSION = 1


def _options(cache_mb: int) -> Options:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_max_open_files(256)
    opts.set_keep_log_file_num(2)
    opts.set_write_buffer_size(8 * 1024 * 1024)
    opts.set_max_write_buffer_number(2)
    table = BlockBasedOptions()
    table.set_block_cache(Cache(cache_mb * 1024 * 1024))
    opts.set_block_based_table_factory(table)
    return opts


class PartitionStore:
    """Projections of the runs of one partition, on disk."""

    def __init__(self, path: Path, *, read_only: bool = False, cache_mb: int = 16) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        opts = _options(cache_mb)
        families = {name: _options(cache_mb) for name in COLUMN_FAMILIES}
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
        return sum(1 for _ in self.items(family))

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


class StoreBatch:
    """Projection changes written atomically, together with the facts offset."""

    def __init__(self, handles: dict[str, Any]) -> None:
        self.raw = WriteBatch(raw_mode=True)
        self._h = handles

    def put_run(self, state: RunState) -> None:
        self.raw.put(keys.run_key(state.run_id), state.model_dump_json().encode(), self._h["runs"])

    def put_fact(self, run_id: str, seq: int, fact_key: str, encoded: bytes) -> None:
        self.raw.put(keys.history_key(run_id, seq), encoded, self._h["history"])
        self.raw.put(keys.fact_key_key(run_id, fact_key), keys.u64(seq), self._h["fact_keys"])

    def put_due(self, entry: DueEntry) -> None:
        self.raw.put(keys.due_key(entry), b"", self._h["due"])

    def delete_due(self, entry: DueEntry) -> None:
        self.raw.delete(keys.due_key(entry), self._h["due"])

    def put_claim(self, idempotency_key: str, run_id: str, fingerprint: str | None) -> None:
        value = json.dumps({"run_id": run_id, "fingerprint": fingerprint}).encode()
        self.raw.put(keys.string_key(idempotency_key), value, self._h["claims"])

    def set_facts_offset(self, offset: int) -> None:
        self.raw.put(_FACTS_OFFSET, keys.u64(offset), self._h["meta"])
