"""Facts of one run committed together, as one record of runs.facts.

With ``PROCESSOR_FACT_BATCHES`` the processor writes the facts that one transaction
appends to one run as a single record: a ``FactBatch`` whose items are the facts'
values exactly as each would be written alone. A reader of the journal expands such
a record into its facts (``unpack``), each with the record's key and offset, so
what folds, replays and shows facts sees the same facts in the same order either
way (docs/design/fact-batches.md).

``unpack`` reads the Avro array by hand: it runs once per record on every read of
the journal, where a general decoder costs more than the facts it hands out.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

from processor.errors import FactDecodeError
from processor.facts.codec import BODY_START, SINGLE_OBJECT_MAGIC, codec, encode
from processor.facts.models import FactBatch

__all__ = ["MAX_BATCH_BYTES", "batch_header", "batch_of", "is_batch", "pack", "unpack"]

#: The most fact bytes one record holds; more facts of a run go to further records.
#: Well under Kafka's default record size limit (1 MiB) with the framing added.
MAX_BATCH_BYTES = 256 * 1024


@cache
def batch_header() -> bytes:
    """The first bytes of every ``FactBatch`` value: its single-object header."""
    return SINGLE_OBJECT_MAGIC + codec().fingerprint_of(FactBatch)


def is_batch(value: bytes | None) -> bool:
    return value is not None and value.startswith(batch_header())


def pack(values: Sequence[bytes], max_bytes: int = MAX_BATCH_BYTES) -> list[bytes]:
    """One run's encoded facts, in order, as the values of as few records as fit
    ``max_bytes`` each: a ``FactBatch`` of several, or a lone fact as it is."""
    records: list[bytes] = []
    chunk: list[bytes] = []
    size = 0
    for value in values:
        if chunk and size + len(value) > max_bytes:
            records.append(_record(chunk))
            chunk, size = [], 0
        chunk.append(value)
        size += len(value)
    if chunk:
        records.append(_record(chunk))
    return records


def _record(chunk: list[bytes]) -> bytes:
    return chunk[0] if len(chunk) == 1 else batch_of(chunk)


def batch_of(values: Sequence[bytes]) -> bytes:
    """The ``FactBatch`` value holding ``values``, as they are."""
    return encode(FactBatch(facts=list(values)))


def unpack(value: bytes) -> list[bytes]:
    """The facts of a ``FactBatch`` value, in order.

    Raises FactDecodeError (``malformed``, keeping ``value``) when it is cut short or
    has bytes past its end.
    """
    facts: list[bytes] = []
    position = BODY_START
    try:
        while True:
            count, position = _long(value, position)
            if count == 0:
                break
            if count < 0:  # a block that gives its size in bytes too
                count = -count
                _, position = _long(value, position)
            for _ in range(count):
                size, position = _long(value, position)
                end = position + size
                if size < 0 or end > len(value):
                    raise IndexError(end)
                facts.append(value[position:end])
                position = end
    except IndexError:
        raise FactDecodeError("malformed", "a fact batch cut short", value) from None
    if position != len(value):
        raise FactDecodeError("malformed", "bytes after a fact batch's end", value)
    return facts


def _long(data: bytes, position: int) -> tuple[int, int]:
    """The zig-zag varint at ``position`` and the position after it."""
    shift = result = 0
    while True:
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (result >> 1) ^ -(result & 1), position
        shift += 7
        if shift > 63:
            raise IndexError(position)
