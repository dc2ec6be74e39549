"""A run's history in the store: its facts in chunks, one chunk per write.

Each write of a partition store (a loop commit, a catch-up batch) adds, for every
run it touched, one history row with the facts it added to the run's journal:
key (run id, seq of the chunk's first fact), value a chunk of entries, each
``string_key(fact key) + u32 length + encoded fact``. One row per run per write,
instead of one per fact, is most of what makes replay fast; the fact keys in the
chunk serve conditional append (``fact_keys``) without a row per fact either.

Where chunks begin depends on how facts were batched, so two stores with the
same facts can hold different rows: compare histories run by run (``replay``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator

__all__ = ["chunk_entries", "chunk_fact_keys", "encode_chunk"]

_U32 = struct.Struct(">I")


def encode_chunk(entries: Iterable[tuple[str, bytes]]) -> bytes:
    """The chunk of (fact key, encoded fact) entries, in journal order."""
    parts: list[bytes] = []
    for fact_key, encoded in entries:
        raw_key = fact_key.encode()
        parts += (_U32.pack(len(raw_key)), raw_key, _U32.pack(len(encoded)), encoded)
    return b"".join(parts)


def chunk_entries(chunk: bytes) -> Iterator[tuple[str, bytes]]:
    """(fact key, encoded fact) of each entry of ``chunk``, in order."""
    for at, key_end, fact_end in _spans(chunk):
        yield chunk[at + 4 : key_end].decode(), chunk[key_end + 4 : fact_end]


def chunk_fact_keys(chunk: bytes) -> Iterator[str]:
    """The fact key of each entry of ``chunk``, in order, without copying the facts."""
    for at, key_end, _ in _spans(chunk):
        yield chunk[at + 4 : key_end].decode()


def _spans(chunk: bytes) -> Iterator[tuple[int, int, int]]:
    """(start, end of the key, end of the fact) of each entry of ``chunk``."""
    at, end = 0, len(chunk)
    unpack = _U32.unpack_from
    while at < end:
        key_end = at + 4 + unpack(chunk, at)[0]
        fact_end = key_end + 4 + unpack(chunk, key_end)[0]
        if fact_end > end:
            raise ValueError(f"history chunk truncated: an entry ends at {fact_end} of {end}")
        yield at, key_end, fact_end
        at = fact_end
