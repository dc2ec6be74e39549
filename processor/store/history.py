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

__all__ = ["chunk_fact_keys", "chunk_facts", "encode_chunk"]

_U32 = struct.Struct(">I")
#: The single-object header before every Avro body: marker (2 bytes) and fingerprint (8).
_HEADER = 10


def encode_chunk(run_id: str, facts: Iterable[bytes]) -> bytes:
    """The chunk of ``run_id``'s encoded ``facts``, in journal order."""
    parts: list[bytes] = []
    for fact in facts:
        body = _body_after_run_id(fact, run_id)
        parts += (_U32.pack(_HEADER + len(fact) - body), fact[:_HEADER], fact[body:])
    return b"".join(parts)


def chunk_facts(run_id: str, chunk: bytes) -> Iterator[bytes]:
    """The encoded facts of ``chunk`` (a chunk of ``run_id``'s), whole again, in order."""
    run_id_field = _avro_string(run_id.encode())
    for at, end in _spans(chunk):
        yield chunk[at : at + _HEADER] + run_id_field + chunk[at + _HEADER : end]


def chunk_fact_keys(chunk: bytes) -> Iterator[str]:
    """The fact key of each entry of ``chunk``, in order, without decoding the facts."""
    for at, end in _spans(chunk):
        key_at = at + _HEADER
        while key_at < end and chunk[key_at] > 0x7F:  # the seq, a varint: skipped
            key_at += 1
        length, key_at = _read_varint(chunk, key_at + 1, end)
        key_end = key_at + (length >> 1)  # zigzag: a length is never negative
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


def _body_after_run_id(fact: bytes, run_id: str) -> int:
    """Where ``fact``'s body goes on after its run id field, which must be ``run_id``."""
    length, text_at = _read_varint(fact, _HEADER, len(fact))
    body = text_at + (length >> 1)
    if fact[text_at:body] != run_id.encode():
        raise ValueError(f"a fact of another run in the history of {run_id!r}")
    return body


def _avro_string(raw: bytes) -> bytes:
    """``raw`` as Avro writes a string: its zigzag varint length, then the bytes."""
    out = bytearray()
    number = len(raw) << 1
    while number > 0x7F:
        out.append(number & 0x7F | 0x80)
        number >>= 7
    out.append(number)
    return bytes(out) + raw


def _read_varint(data: bytes, at: int, end: int) -> tuple[int, int]:
    """The (unsigned, still zigzag-encoded) varint at ``data[at]`` and where it ends."""
    if at < end and data[at] < 0x80:  # most are one byte
        return data[at], at + 1
    number = shift = 0
    while at < end:
        byte = data[at]
        number |= (byte & 0x7F) << shift
        at += 1
        if byte < 0x80:
            return number, at
        shift += 7
    raise ValueError("history chunk entry truncated inside a varint")
