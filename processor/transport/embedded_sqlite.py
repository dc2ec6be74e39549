"""The SQLite layer of the embedded log: schema, one connection per client, appends, fetches.

Every client object of the embedded transport owns one ``LogConnection``. Writers
take the database lock up front (``BEGIN IMMEDIATE``) so two writers never
deadlock upgrading a read lock, and wait for each other through a generous busy
timeout. WAL journal mode lets readers run while one writer commits, across
threads and processes alike.

Layout (all tables ``WITHOUT ROWID``, clustered on their primary key):

- ``topics(name, id, partitions, config)``: the topic catalogue; ``id`` is a small
  integer so record keys stay short.
- ``partitions(topic_id, partition, next_offset)``: the log end of each partition.
  Offsets are assigned from it inside the write transaction, so they are dense.
- ``records(topic_id, partition, offset, key, value, headers, timestamp_ms)``.
- ``group_owners(grp, epoch, instance_id)``: the fencing epoch of processor groups.
- ``offsets``, ``claims``, ``acks`` ``(grp, topic, partition, next_offset)``: committed
  offsets of processor groups, claimed and acknowledged positions of worker groups.
- ``members(grp, member, alive_until_ms)`` and ``member_claims(grp, topic, partition,
  offset, member)``: the live members of worker groups and the records each claimed
  and has not committed (handed to another member once it is gone).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import sqlite3
import struct
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from processor.errors import TransportError
from processor.transport.base import Headers, Outbound, Record, TopicPartition, ValueBatch
from processor.transport.clock import wall_clock_ms
from processor.transport.partitioner import partition_for

__all__ = [
    "DB_FILE_NAME",
    "LogConnection",
    "OffsetTable",
    "PendingRecord",
    "TopicMeta",
    "decode_headers",
    "encode_headers",
    "fair_shares",
    "initialize_log",
]

logger = logging.getLogger(__name__)

DB_FILE_NAME = "log.sqlite3"
_BUSY_TIMEOUT_S = 120.0
_SCHEMA_VERSION = 1
_MMAP_BYTES = 256 * 1024 * 1024
_MIN_BACKOFF_S = 0.001
_MAX_BACKOFF_S = 0.020

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS topics (
        name TEXT PRIMARY KEY, id INTEGER NOT NULL UNIQUE,
        partitions INTEGER NOT NULL, config TEXT NOT NULL) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS partitions (
        topic_id INTEGER NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL,
        PRIMARY KEY (topic_id, partition)) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS records (
        topic_id INTEGER NOT NULL, partition INTEGER NOT NULL, offset INTEGER NOT NULL,
        key BLOB, value BLOB, headers BLOB, timestamp_ms INTEGER NOT NULL,
        PRIMARY KEY (topic_id, partition, offset)) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS group_owners (
        grp TEXT PRIMARY KEY, epoch INTEGER NOT NULL, instance_id TEXT NOT NULL) WITHOUT ROWID""",
    *(
        f"""CREATE TABLE IF NOT EXISTS {table} (
        grp TEXT NOT NULL, topic TEXT NOT NULL, partition INTEGER NOT NULL,
        next_offset INTEGER NOT NULL, PRIMARY KEY (grp, topic, partition)) WITHOUT ROWID"""
        for table in ("offsets", "claims", "acks")
    ),
    """CREATE TABLE IF NOT EXISTS members (
        grp TEXT NOT NULL, member TEXT NOT NULL, alive_until_ms INTEGER NOT NULL,
        PRIMARY KEY (grp, member)) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS member_claims (
        grp TEXT NOT NULL, topic TEXT NOT NULL, partition INTEGER NOT NULL,
        offset INTEGER NOT NULL, member TEXT NOT NULL,
        PRIMARY KEY (grp, topic, partition, offset)) WITHOUT ROWID""",
)

_SELECT_TOPICS = "SELECT name, id, partitions, config FROM topics"
_SELECT_ENDS = "SELECT partition, next_offset FROM partitions WHERE topic_id = ? ORDER BY partition"
_SELECT_END = "SELECT next_offset FROM partitions WHERE topic_id = ? AND partition = ?"
_ADVANCE_END = "UPDATE partitions SET next_offset = ? WHERE topic_id = ? AND partition = ?"
_INSERT_RECORD = "INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?)"
_FETCH = (
    "SELECT offset, key, value, headers, timestamp_ms FROM records"
    " WHERE topic_id = ? AND partition = ? AND offset >= ? AND offset < ?"
    " ORDER BY offset LIMIT ?"
)

_FETCH_VALUES = (
    "SELECT offset, value FROM records"
    " WHERE topic_id = ? AND partition = ? AND offset >= ? AND offset < ?"
    " ORDER BY offset LIMIT ?"
)

_LENGTH = struct.Struct(">I")

K = TypeVar("K")


@dataclass(frozen=True, slots=True)
class TopicMeta:
    """A topic as the catalogue knows it; immutable once created."""

    name: str
    id: int
    partitions: int
    config: Mapping[str, str]


# A record resolved to its partition and encoded, waiting for a commit:
# (topic, topic_id, partition, key, value, encoded headers). A plain tuple: it is
# built once per produced record on the hot path.
PendingRecord = tuple[str, int, int, bytes | None, bytes | None, bytes | None]


def encode_headers(headers: Headers) -> bytes | None:
    """Encode header pairs as length-prefixed name and value bytes (None when empty)."""
    if not headers:
        return None
    try:
        return _encode_headers_cached(headers)
    except TypeError:  # unhashable values such as bytearray: encode without the cache
        return _encode_headers(headers)


def decode_headers(blob: bytes) -> Headers:
    """Decode what ``encode_headers`` wrote, exactly."""
    return _decode_headers_cached(blob)


def _encode_headers(headers: Headers) -> bytes:
    out = bytearray()
    for name, value in headers:
        raw = name.encode("utf-8", "surrogatepass")
        out += _LENGTH.pack(len(raw))
        out += raw
        out += _LENGTH.pack(len(value))
        out += value
    return bytes(out)


def _decode_headers(blob: bytes) -> Headers:
    pairs: list[tuple[str, bytes]] = []
    pos, size = 0, len(blob)
    while pos < size:
        (length,) = _LENGTH.unpack_from(blob, pos)
        name = blob[pos + 4 : pos + 4 + length].decode("utf-8", "surrogatepass")
        pos += 4 + length
        (length,) = _LENGTH.unpack_from(blob, pos)
        pairs.append((name, blob[pos + 4 : pos + 4 + length]))
        pos += 4 + length
    return tuple(pairs)


# Most records carry one of a few header sets (a fact type, a content type): memoize
# both directions. Headers are immutable tuples, so sharing decoded ones is safe.
_encode_headers_cached = functools.lru_cache(maxsize=4096)(_encode_headers)
_decode_headers_cached = functools.lru_cache(maxsize=4096)(_decode_headers)
# Run ids repeat across a run's records: memoize murmur2 placement too.
_partition_for_cached = functools.lru_cache(maxsize=16384)(partition_for)


def fair_shares(
    available: Sequence[tuple[K, int]], budget: int, rotation: int
) -> list[tuple[K, int]]:
    """Split ``budget`` records over the partitions that have some, fairly.

    Every partition first gets an equal share of what is left (a partition with
    fewer records passes the rest on); a second pass hands any remainder to those
    with more. ``rotation`` moves the starting partition, so over successive polls
    no partition is always first or always last.
    """
    items = [item for item in available if item[1] > 0]
    if not items or budget <= 0:
        return []
    start = rotation % len(items)
    items = items[start:] + items[:start]
    grants = _equal_grants([count for _, count in items], budget)
    return [(key, grant) for (key, _), grant in zip(items, grants, strict=True) if grant > 0]


def _equal_grants(counts: list[int], budget: int) -> list[int]:
    grants: list[int] = []
    remaining = budget
    for index, count in enumerate(counts):
        grant = min(count, -(-remaining // (len(counts) - index)))
        grants.append(grant)
        remaining -= grant
    for index, count in enumerate(counts):
        extra = min(count - grants[index], remaining)
        grants[index] += extra
        remaining -= extra
    return grants


def _partition(key: bytes, partitions: int) -> int:
    """``partition_for`` through its cache (unhashable keys such as bytearray bypass it)."""
    try:
        return _partition_for_cached(key, partitions)
    except TypeError:
        return partition_for(key, partitions)


def _record_slot_setters() -> tuple[Callable[[Record, Any], None], ...] | None:
    """Record's slot setters, if filling the slots directly equals calling ``__init__``.

    That holds for a slotted dataclass with exactly our fields and no
    ``__post_init__``; if ``Record`` ever changes shape we fall back to ``__init__``.
    """
    names = tuple(f.name for f in dataclasses.fields(Record))
    if names != _RECORD_FIELDS or hasattr(Record, "__post_init__"):
        return None
    if "__slots__" not in vars(Record):
        return None
    return tuple(getattr(Record, name).__set__ for name in names)


_RECORD_FIELDS = ("topic", "partition", "offset", "key", "value", "headers", "timestamp_ms")
_RECORD_SETTERS = _record_slot_setters()


def _build_records(topic: str, partition: int, rows: list[Any]) -> list[Record]:
    """Records from ``_FETCH`` rows; the hot path of replay.

    Filling the slots through their descriptors skips the frozen dataclass's
    ``__init__`` (seven ``object.__setattr__`` calls) and reads about 1.4x faster.
    """
    decode = _decode_headers_cached
    if _RECORD_SETTERS is None:
        return [
            Record(topic, partition, offset, key, value, decode(h) if h else (), ts)
            for offset, key, value, h, ts in rows
        ]
    set_topic, set_partition, set_offset, set_key, set_value, set_headers, set_ts = _RECORD_SETTERS
    new = object.__new__
    records: list[Record] = []
    append = records.append
    for offset, key, value, h, ts in rows:
        record = new(Record)
        set_topic(record, topic)
        set_partition(record, partition)
        set_offset(record, offset)
        set_key(record, key)
        set_value(record, value)
        set_headers(record, decode(h) if h else ())
        set_ts(record, ts)
        append(record)
    return records


def _connect(db_file: Path, durable: bool) -> sqlite3.Connection:
    """Open a connection in autocommit mode; transactions are explicit."""
    conn = sqlite3.connect(
        db_file,
        timeout=_BUSY_TIMEOUT_S,
        isolation_level=None,
        check_same_thread=False,  # handed between threads is fine; shared concurrently is not
        cached_statements=256,
    )
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
        conn.execute("PRAGMA cache_size = -16000")
        # Reads through a memory map skip a read() system call per page (replay).
        conn.execute(f"PRAGMA mmap_size = {_MMAP_BYTES}")
        conn.execute("PRAGMA temp_store = MEMORY")
    except sqlite3.Error:
        conn.close()
        raise
    return conn


def initialize_log(db_file: Path, durable: bool) -> None:
    """Create the database file and its schema if they do not exist yet."""
    try:
        db_file.parent.mkdir(parents=True, exist_ok=True)
        conn = _connect(db_file, durable)
    except (OSError, sqlite3.Error) as exc:
        raise TransportError(f"embedded log {db_file}: cannot open: {exc}") from exc
    try:
        _create_schema(conn, db_file)
    finally:
        conn.close()


def _create_schema(conn: sqlite3.Connection, db_file: Path) -> None:
    try:
        conn.execute("BEGIN IMMEDIATE")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > _SCHEMA_VERSION:
            conn.execute("ROLLBACK")
            raise TransportError(
                f"embedded log {db_file}: schema version {version} is newer than this "
                f"processor supports ({_SCHEMA_VERSION})"
            )
        for statement in _SCHEMA:
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        raise TransportError(f"embedded log {db_file}: cannot create schema: {exc}") from exc


class OffsetTable:
    """One of the per-group position tables: ``offsets``, ``claims`` or ``acks``."""

    def __init__(self, table: str) -> None:
        if table not in {"offsets", "claims", "acks"}:
            raise ValueError(f"not a position table: {table!r}")
        self.select = f"SELECT topic, partition, next_offset FROM {table} WHERE grp = ?"
        self.upsert = (
            f"INSERT INTO {table} (grp, topic, partition, next_offset) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (grp, topic, partition) DO UPDATE SET next_offset = excluded.next_offset"
        )


#: The offsets processor sessions commit with their transactions.
SESSION_OFFSETS = OffsetTable("offsets")


class LogConnection:
    """One SQLite connection to the log, owned by one client object.

    The connection may be handed from one thread to another but never used by two
    threads at once. Every ``sqlite3`` error is translated into ``TransportError``.
    """

    def __init__(self, db_file: Path, durable: bool) -> None:
        self.db_file = db_file
        self._topics: dict[str, TopicMeta] = {}
        with self.translated("open"):
            self._conn: sqlite3.Connection | None = _connect(db_file, durable)

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called."""
        return self._conn is None

    def close(self) -> None:
        """Close the connection; later calls fail with TransportError."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with self.translated("close"):
                conn.close()

    @property
    def conn(self) -> sqlite3.Connection:
        """The open connection."""
        if self._conn is None:
            raise TransportError(f"embedded log {self.db_file}: client is closed")
        return self._conn

    @contextmanager
    def translated(self, action: str) -> Iterator[None]:
        """Turn sqlite3 errors raised inside the block into TransportError."""
        try:
            yield
        except sqlite3.Error as exc:
            raise TransportError(f"embedded log {self.db_file}: {action} failed: {exc}") from exc

    @contextmanager
    def write(self, action: str) -> Iterator[sqlite3.Connection]:
        """Run the block in one write transaction; roll back if anything escapes it."""
        conn = self.conn
        with self.translated(action):
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                self._rollback(conn)
                raise

    def _rollback(self, conn: sqlite3.Connection) -> None:
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error:
            logger.exception("embedded log %s: rollback failed", self.db_file)

    def topics(self) -> dict[str, TopicMeta]:
        """Reload the topic catalogue."""
        with self.translated("read topics"):
            rows = self.conn.execute(_SELECT_TOPICS).fetchall()
        self._topics = {
            name: TopicMeta(name, topic_id, partitions, json.loads(config))
            for name, topic_id, partitions, config in rows
        }
        return dict(self._topics)

    def topic(self, name: str) -> TopicMeta:
        """The topic called ``name``; TransportError when it does not exist."""
        meta = self._topics.get(name)
        if meta is None:
            meta = self.topics().get(name)
        if meta is None:
            raise TransportError(
                f"embedded log {self.db_file}: unknown topic {name!r}; "
                "create it first with admin().create_topics"
            )
        return meta

    def checked_partition(self, tp: TopicPartition) -> TopicMeta:
        """The topic of ``tp``, after checking the partition exists."""
        meta = self.topic(tp.topic)
        if not 0 <= tp.partition < meta.partitions:
            raise TransportError(
                f"partition {tp.partition} of topic {tp.topic!r} does not exist "
                f"(the topic has {meta.partitions})"
            )
        return meta

    def pending(self, record: Outbound) -> PendingRecord:
        """Resolve the partition of ``record`` (murmur2 of the key unless explicit)."""
        meta = self.topic(record.topic)
        partition = record.partition
        if partition is None:
            partition = _partition(record.key, meta.partitions)
        elif not 0 <= partition < meta.partitions:
            self.checked_partition(TopicPartition(meta.name, partition))  # raises
        headers = encode_headers(record.headers)
        return (meta.name, meta.id, partition, record.key, record.value, headers)

    def append(self, batch: Sequence[PendingRecord]) -> list[tuple[TopicPartition, int]]:
        """Insert ``batch`` with dense offsets; call inside ``write``. Returns positions."""
        conn = self.conn
        timestamp_ms = wall_clock_ms()
        ends: dict[tuple[int, int], int] = {}
        tps: dict[tuple[int, int], TopicPartition] = {}
        rows, positions = [], []
        for topic, topic_id, partition, key, value, headers in batch:
            slot = (topic_id, partition)
            offset = ends.get(slot)
            if offset is None:
                offset = int(conn.execute(_SELECT_END, slot).fetchone()[0])
                tps[slot] = TopicPartition(topic, partition)
            ends[slot] = offset + 1
            rows.append((topic_id, partition, offset, key, value, headers, timestamp_ms))
            positions.append((tps[slot], offset))
        conn.executemany(_INSERT_RECORD, rows)
        conn.executemany(_ADVANCE_END, [(end, tid, p) for (tid, p), end in ends.items()])
        return positions

    def partition_ends(self, meta: TopicMeta) -> list[tuple[TopicPartition, int]]:
        """The next offset of every partition of ``meta``."""
        with self.translated("read partition ends"):
            rows = self.conn.execute(_SELECT_ENDS, (meta.id,)).fetchall()
        return [(TopicPartition(meta.name, partition), end) for partition, end in rows]

    def end_offset(self, meta: TopicMeta, partition: int) -> int:
        """The next offset of one partition."""
        with self.translated("read end offset"):
            return int(self.conn.execute(_SELECT_END, (meta.id, partition)).fetchone()[0])

    def fetch(
        self, meta: TopicMeta, partition: int, start: int, end: int, limit: int
    ) -> list[Record]:
        """Records of one partition in ``[start, end)``, at most ``limit``, in offset order."""
        with self.translated("fetch records"):
            rows = self.conn.execute(_FETCH, (meta.id, partition, start, end, limit)).fetchall()
        return _build_records(meta.name, partition, rows)

    def fetch_values(
        self, meta: TopicMeta, partition: int, start: int, end: int, limit: int
    ) -> ValueBatch | None:
        """``fetch``, only the values (None when there is no record in the range)."""
        with self.translated("fetch records"):
            rows = self.conn.execute(
                _FETCH_VALUES, (meta.id, partition, start, end, limit)
            ).fetchall()
        if not rows:
            return None
        return ValueBatch([value for _, value in rows], rows[-1][0] + 1)

    def load_positions(self, table: OffsetTable, group: str) -> dict[TopicPartition, int]:
        """The positions a group stored in ``table``."""
        with self.translated("read group positions"):
            rows = self.conn.execute(table.select, (group,)).fetchall()
        return {TopicPartition(topic, partition): offset for topic, partition, offset in rows}

    def store_positions(
        self, table: OffsetTable, group: str, positions: Mapping[TopicPartition, int]
    ) -> None:
        """Upsert positions of a group into ``table``; call inside ``write``."""
        rows = [(group, tp.topic, tp.partition, offset) for tp, offset in positions.items()]
        self.conn.executemany(table.upsert, rows)

    def data_version(self) -> int:
        """A number that changes whenever another connection commits."""
        with self.translated("read data version"):
            return int(self.conn.execute("PRAGMA data_version").fetchone()[0])

    def poll_until(self, attempt: Callable[[], list[Record]], timeout_s: float) -> list[Record]:
        """Call ``attempt`` until it returns records, re-trying when the log changes."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            version = self.data_version()
            records = attempt()
            if records or not self._wait_for_change(version, deadline):
                return records

    def _wait_for_change(self, version: int, deadline: float) -> bool:
        """Back off from 1 ms to 20 ms until another connection commits or time is up."""
        backoff = _MIN_BACKOFF_S
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(backoff, left))
            if self.data_version() != version:
                return True
            backoff = min(backoff * 2, _MAX_BACKOFF_S)
        return False
