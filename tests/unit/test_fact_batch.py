"""Fact batches (``facts/fact_batch.py``): packing a run's facts into records, reading
them back, and refusing a batch that is cut short."""

from __future__ import annotations

import io
import os
from pathlib import Path

import fastavro
import pytest

from processor.engine.fact_records import batched
from processor.errors import FactDecodeError
from processor.facts.codec import codec, decode, decode_fact, encode
from processor.facts.fact_batch import batch_header, is_batch, pack, unpack
from processor.facts.models import FactBatch, RunSucceeded
from processor.facts.topics import TopicName
from processor.transport.base import Outbound, Record, TopicPartition, TopicSpec, ValueBatch
from processor.transport.embedded import EmbeddedTransport
from processor.transport.fact_batches import (
    _expand_values,
    _native_expand,
    expand_records,
    expand_values,
    is_journal,
)


def _fact(seq: int, run_id: str = "run-1") -> bytes:
    """A fact of ``run_id`` at ``seq``; its size grows with ``seq``."""
    return encode(
        RunSucceeded(
            run_id=run_id,
            seq=seq,
            fact_key=f"{run_id}/{seq}",
            time_ms=5 + seq,
            cause_id=f"segments.results/0/{seq}",
            result=b"x" * seq,
        )
    )


def test_a_runs_facts_become_one_record_and_read_back_in_order() -> None:
    facts = [_fact(seq) for seq in range(1, 6)]
    (record,) = pack(facts)
    assert is_batch(record) and record.startswith(batch_header())
    assert unpack(record) == facts
    # The hand-written reader agrees with the general Avro decoder.
    decoded = decode(record)
    assert isinstance(decoded, FactBatch) and decoded.facts == facts
    assert [decode_fact(value).seq for value in unpack(record)] == [1, 2, 3, 4, 5]


def test_a_lone_fact_stays_the_record_it_always_was() -> None:
    fact = _fact(1)
    assert pack([fact]) == [fact]
    assert not is_batch(fact)
    assert pack([]) == []


def test_facts_past_the_size_limit_go_to_further_records_in_order() -> None:
    facts = [_fact(seq) for seq in range(1, 8)]
    limit = sum(len(f) for f in facts[:3])
    records = pack(facts, max_bytes=limit)
    assert len(records) == 3
    expanded = [f for r in records for f in (unpack(r) if is_batch(r) else [r])]
    assert expanded == facts
    assert all(sum(map(len, unpack(r))) <= limit for r in records if is_batch(r))


def test_an_array_written_in_sized_blocks_reads_the_same() -> None:
    """Avro lets a writer give a block's size in bytes (a negative count); any writer's
    batch must read."""
    facts = [_fact(1), _fact(2), _fact(3)]
    body = io.BytesIO()
    block = io.BytesIO()
    for fact in facts:
        fastavro.schemaless_writer(block, "bytes", fact)
    fastavro.schemaless_writer(body, "long", -len(facts))
    fastavro.schemaless_writer(body, "long", len(block.getvalue()))
    body.write(block.getvalue())
    fastavro.schemaless_writer(body, "long", 0)
    assert unpack(batch_header() + body.getvalue()) == facts


@pytest.mark.parametrize("cut", [1, 5, 40])
def test_a_batch_cut_short_is_malformed(cut: int) -> None:
    (record,) = pack([_fact(1), _fact(2)])
    with pytest.raises(FactDecodeError) as raised:
        unpack(record[:-cut])
    assert raised.value.reason == "malformed"


def test_bytes_after_a_batch_are_malformed() -> None:
    (record,) = pack([_fact(1), _fact(2)])
    with pytest.raises(FactDecodeError, match="after"):
        unpack(record + b"\x00")


def test_readers_expand_batches_with_the_records_key_offset_and_time() -> None:
    one, two = [_fact(1, "a"), _fact(2, "a")], [_fact(1, "b")]
    (batch_a,) = pack(one)
    records = [
        Record("runs.facts", 0, 7, b"a", batch_a, (("h", b"1"),), 99),
        Record("runs.facts", 0, 8, b"b", two[0]),
    ]
    expanded = expand_records(records)
    assert [(r.offset, r.key, r.value) for r in expanded] == [
        (7, b"a", one[0]),
        (7, b"a", one[1]),
        (8, b"b", two[0]),
    ]
    assert expanded[1].headers == (("h", b"1"),) and expanded[1].timestamp_ms == 99
    plain = [records[1]]
    assert expand_records(plain) is plain  # nothing to expand: the batch as it was
    values = expand_values(ValueBatch([None, batch_a, two[0]], 9))
    assert values == ValueBatch([None, *one, two[0]], 9)


def test_a_transactions_facts_are_batched_per_run_and_partition() -> None:
    facts = TopicName.FACTS.value
    a1, a2, b1, a3 = _fact(1, "a"), _fact(2, "a"), _fact(1, "b"), _fact(3, "a")
    outbound = [
        Outbound(facts, b"a", a1, (), 0),
        Outbound("segments.work", b"a", b"work"),
        Outbound(facts, b"b", b1, (), 1),
        Outbound(facts, b"a", a2, (), 0),
        Outbound(facts, b"a", a3, (), 0),
    ]
    out = batched(outbound, facts)
    assert out[0] == Outbound("segments.work", b"a", b"work")
    assert [(o.key, o.partition) for o in out[1:]] == [(b"a", 0), (b"b", 1)]
    assert unpack(out[1].value) == [a1, a2, a3]
    assert out[2].value == b1  # one fact: no batch
    assert codec().model_of(out[1].value[2:10]) is FactBatch


def test_only_the_journal_is_expanded(tmp_path: Path) -> None:
    """A user topic's record that begins like a batch reads as it was written."""
    transport = EmbeddedTransport(tmp_path / "log")
    admin = transport.admin()
    admin.create_topics([TopicSpec("orders", 1), TopicSpec("x.runs.facts", 1)])
    admin.close()
    (batch,) = pack([_fact(1), _fact(2)])
    producer = transport.producer()
    producer.produce(Outbound("orders", b"k", batch))
    producer.produce(Outbound("x.runs.facts", b"k", batch))
    producer.flush()
    producer.close()
    reader = transport.reader()
    try:
        (orders,) = reader.read(TopicPartition("orders", 0), 0)
        (journal,) = reader.read(TopicPartition("x.runs.facts", 0), 0)
        (values,) = reader.read_values(TopicPartition("orders", 0), 0)
    finally:
        reader.close()
    assert [r.value for r in orders] == [batch] and values.values == [batch]
    assert [r.value for r in journal] == [_fact(1), _fact(2)]
    assert is_journal("runs.facts") and is_journal("x.runs.facts") and not is_journal("orders")


requires_native_split = pytest.mark.skipif(
    _native_expand() is None and os.environ.get("CI") != "true",
    reason="processor_native is not installed (make installs it where cargo is found)",
)


@requires_native_split
def test_the_compiled_split_agrees_with_the_python_one() -> None:
    assert _native_expand() is not None
    facts = [_fact(seq, f"run-{seq % 3}") for seq in range(1, 40)]
    values: list[bytes | None] = [facts[0], None, *pack(facts[1:9]), facts[9], *pack(facts[10:])]
    batch = ValueBatch(values, 17)
    assert (
        expand_values(batch)
        == _expand_values(batch)
        == ValueBatch([facts[0], None, *facts[1:]], 17)
    )
    plain = ValueBatch([facts[0], None, facts[1]], 3)
    assert expand_values(plain) is plain
    # A batch that does not decode: the Python path raises with the reason.
    (cut,) = pack(facts[:3])
    with pytest.raises(FactDecodeError) as raised:
        expand_values(ValueBatch([facts[0], cut[:-2]], 2))
    assert raised.value.reason == "malformed"
