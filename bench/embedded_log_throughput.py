"""Throughput of the embedded log: transactional commits in batches, and Reader.read.

Run: ``PYTHONPATH=. python bench/embedded_log_throughput.py [--records N] [--durable]``.
Prints records/s for session commits (batches of ``--batch`` records with consumed
offsets, like the processor), for a plain producer, and for reading everything back.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from processor.transport.base import Outbound, TopicPartition, TopicSpec
from processor.transport.embedded import EmbeddedTransport

PARTITIONS = 4


def _outbound(topic: str, index: int, value: bytes) -> Outbound:
    key = f"run-{index % 997:05d}".encode()
    return Outbound(topic, key, value, headers=(("type", b"SegmentCompleted"),))


def bench_commits(transport: EmbeddedTransport, records: int, batch: int, value: bytes) -> float:
    """Records/s committed by a processor session, ``batch`` records per transaction."""
    session = transport.session("bench", "bench-1")
    session.subscribe(["bench.in"], lambda _: None, lambda _: None)
    session.poll(1, 0.0)
    started = time.perf_counter()
    for first in range(0, records, batch):
        session.begin()
        for index in range(first, min(first + batch, records)):
            session.produce(_outbound("bench.out", index, value))
        session.commit({TopicPartition("bench.in", 0): first})
    elapsed = time.perf_counter() - started
    session.close()
    return records / elapsed


def bench_producer(transport: EmbeddedTransport, records: int, value: bytes) -> float:
    """Records/s appended by a plain producer (flushes every 1000 records)."""
    producer = transport.producer()
    started = time.perf_counter()
    for index in range(records):
        producer.produce(_outbound("bench.plain", index, value))
    producer.flush()
    elapsed = time.perf_counter() - started
    producer.close()
    return records / elapsed


def bench_read(transport: EmbeddedTransport, topic: str) -> tuple[float, int]:
    """Records/s read back by Reader.read over every partition of ``topic``."""
    reader = transport.reader()
    started = time.perf_counter()
    count = 0
    for partition in range(PARTITIONS):
        for records in reader.read(TopicPartition(topic, partition), 0):
            count += len(records)
    elapsed = time.perf_counter() - started
    reader.close()
    return count / elapsed, count


def main() -> None:
    """Parse arguments, run the three measurements, print them."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--value-size", type=int, default=200)
    parser.add_argument("--durable", action="store_true")
    args = parser.parse_args()
    value = bytes(range(256)) * (args.value_size // 256) + bytes(args.value_size % 256)
    with tempfile.TemporaryDirectory() as tmp:
        transport = EmbeddedTransport(Path(tmp) / "log", durable=args.durable)
        admin = transport.admin()
        names = ("bench.in", "bench.out", "bench.plain")
        admin.create_topics([TopicSpec(name, PARTITIONS) for name in names])
        admin.close()
        commit_rate = bench_commits(transport, args.records, args.batch, value)
        produce_rate = bench_producer(transport, args.records, value)
        read_rate, count = bench_read(transport, "bench.out")
    print(f"records={args.records} value={args.value_size}B durable={args.durable}")
    print(f"session commit, batches of {args.batch}: {commit_rate:>10,.0f} records/s")
    print(f"producer (flush every 1000):      {produce_rate:>10,.0f} records/s")
    print(f"Reader.read ({count} records):   {read_rate:>10,.0f} records/s")


if __name__ == "__main__":
    main()
