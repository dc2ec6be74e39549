"""A run's history in the store: its facts in chunks, one chunk per write.

Each write of a partition store (a loop commit, a catch-up batch) adds, for every
run it touched, one history row with the facts it added to the run's journal:
key (run id, seq of the chunk's first fact), value a chunk of entries, each
``u32 length + the encoded fact without its run id``. One row per run per write,
instead of one per fact, is most of what makes replay fast.

Every fact begins with its run id (the first field after the single-object header),
and the row's key holds it already, so a chunk leaves it out of every fact and
``chunk_facts`` writes it back (in Avro's minimal form, as every writer of facts here
encodes it): a fifth fewer bytes for RocksDB to write, flush and
compact. The fact key, the next field but one, is read straight from the entry
(``chunk_fact_keys``, for conditional append) without decoding the fact.

Where chunks begin depends on how facts were batched, so two stores with the
same facts can hold different rows: compare histories run by run (``replay``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator

from processor.facts.codec import BODY_START, encode_string, fact_key_span, string_span

__all__ = ["chunk_fact_keys", "chunk_facts", "encode_chunk"]

_U32 = struct.Struct(">I")


def encode_chunk(run_id: str, facts: Iterable[bytes]) -> bytes:
    """The chunk of ``run_id``'s encoded ``facts``, in journal order."""
    expected = run_id.encode()
    parts: list[bytes] = []
    for fact in facts:
        start, body = string_span(fact, BODY_START)  # the run id
        if fact[start:body] != expected:
            raise ValueError(f"a fact of another run in the history of {run_id!r}")
        parts += (_U32.pack(BODY_START + len(fact) - body), fact[:BODY_START], fact[body:])
    return b"".join(parts)


def chunk_facts(run_id: str, chunk: bytes) -> Iterator[bytes]:
    """The encoded facts of ``chunk`` (a chunk of ``run_id``'s), whole again, in order."""
    run_id_field = encode_string(run_id)
    for at, end in _spans(chunk):
        yield chunk[at : at + BODY_START] + run_id_field + chunk[at + BODY_START : end]


def chunk_fact_keys(chunk: bytes) -> Iterator[str]:
    """The fact key of each entry of ``chunk``, in order, without decoding the facts."""
    for at, end in _spans(chunk):
        key_at, key_end = fact_key_span(chunk, at + BODY_START)
        if key_end > end:
            raise ValueError(f"history chunk entry at {at}: fact key past the entry's end")
        yield chunk[key_at:key_end].decode()


def _spans(chunk: bytes) -> Iterator[tuple[int, int]]:
    """(start, end) of the fact of each entry of ``chunk``."""
    at, end = 0, len(chunk)
    unpack = _U32.unpack_from
    while at < end:
        fact_end = at + 4 + unpack(chunk, at)[0]
        if fact_end > end:
            raise ValueError(f"history chunk truncated: an entry ends at {fact_end} of {end}")
        yield at + 4, fact_end
        at = fact_end
