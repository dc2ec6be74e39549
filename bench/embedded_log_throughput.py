"""Throughput of the embedded log: transactional commits in batches, and Reader.read.

Run: ``PYTHONPATH=. python bench/embedded_log_throughput.py [--records N] [--durable] [--json]``.

Prints records/s for processor-session commits (``--batch`` records per transaction
with consumed offsets, like the processor loop), for a plain producer, and for
reading everything back with ``Reader.read`` (best of ``--read-passes``). Each
figure is given against wall-clock time and against this process's CPU time; the
second is steadier on a shared machine. The last line is a one-line JSON summary
(``--json``: only that line).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from _support import command_line

from processor.transport.base import Outbound, TopicPartition, TopicSpec
from processor.transport.embedded import EmbeddedTransport

PARTITIONS = 4
HEADERS = (("type", b"SegmentCompleted"),)


class Rate(NamedTuple):
    """Records per second of wall-clock time and of process CPU time."""

    wall: float
    cpu: float

    def __str__(self) -> str:
        return f"{self.wall:>10,.0f} records/s  ({self.cpu:>10,.0f} per CPU-second)"


def measure(records: int, work: Callable[[], object]) -> Rate:
    """Run ``work`` and turn its duration into a rate for ``records`` records."""
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    return Rate(records / (time.perf_counter() - wall), records / (time.process_time() - cpu))


def outbound(topic: str, index: int, keys: int, value: bytes) -> Outbound:
    """One record keyed by one of ``keys`` run ids."""
    return Outbound(topic, b"run-%08d" % (index % keys), value, HEADERS)


def bench_commits(transport: EmbeddedTransport, args: argparse.Namespace, value: bytes) -> Rate:
    """Records committed by a processor session, ``args.batch`` records per transaction."""
    session = transport.session("bench", "bench-1")
    session.subscribe(["bench.in"], lambda _: None, lambda _: None)
    session.poll(1, 0.0)

    def work() -> None:
        for first in range(0, args.records, args.batch):
            session.begin()
            for index in range(first, min(first + args.batch, args.records)):
                session.produce(outbound("bench.out", index, args.keys, value))
            session.commit({TopicPartition("bench.in", 0): first})

    rate = measure(args.records, work)
    session.close()
    return rate


def bench_producer(transport: EmbeddedTransport, args: argparse.Namespace, value: bytes) -> Rate:
    """Records appended by a plain producer (flushes every 1000 records)."""
    producer = transport.producer()

    def work() -> None:
        for index in range(args.records):
            producer.produce(outbound("bench.plain", index, args.keys, value))
        producer.flush()

    rate = measure(args.records, work)
    producer.close()
    return rate


def bench_read(transport: EmbeddedTransport, topic: str, records: int) -> Rate:
    """Records read back by Reader.read over every partition of ``topic``."""
    reader = transport.reader()

    def work() -> None:
        count = 0
        for partition in range(PARTITIONS):
            for batch in reader.read(TopicPartition(topic, partition), 0):
                count += len(batch)
        assert count == records, (count, records)

    rate = measure(records, work)
    reader.close()
    return rate


def main() -> None:
    """Parse arguments, run the measurements, print them."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--value-size", type=int, default=200)
    parser.add_argument("--keys", type=int, default=10_000, help="distinct keys (run ids)")
    parser.add_argument("--read-passes", type=int, default=3, help="report the best pass")
    parser.add_argument("--durable", action="store_true", help="synchronous=FULL")
    parser.add_argument("--json", action="store_true", help="only the one-line JSON summary")
    args = parser.parse_args()
    say = (lambda *_: None) if args.json else print
    value = bytes(range(256)) * (args.value_size // 256) + bytes(args.value_size % 256)
    with tempfile.TemporaryDirectory() as tmp:
        transport = EmbeddedTransport(Path(tmp) / "log", durable=args.durable)
        admin = transport.admin()
        admin.create_topics(
            [TopicSpec(t, PARTITIONS) for t in ("bench.in", "bench.out", "bench.plain")]
        )
        admin.close()
        commits = bench_commits(transport, args, value)
        produced = bench_producer(transport, args, value)
        reads = [bench_read(transport, "bench.out", args.records) for _ in range(args.read_passes)]
    say(
        f"{args.records} records, {args.value_size} B values, 1 header, {args.keys} keys, "
        f"{PARTITIONS} partitions, durable={args.durable}"
    )
    say(f"session commit, {args.batch}/transaction: {commits}")
    say(f"producer, flush every 1000:     {produced}")
    say(f"Reader.read, best of {len(reads)}:        {max(reads)}")
    summary = {
        "bench": "embedded_log_throughput",
        "records": args.records,
        "durable": args.durable,
        "commit_records_per_s": round(commits.wall),
        "produce_records_per_s": round(produced.wall),
        "read_records_per_s": round(max(reads).wall),
        "commit_records_per_cpu_s": round(commits.cpu),
        "produce_records_per_cpu_s": round(produced.cpu),
        "read_records_per_cpu_s": round(max(reads).cpu),
        "command": command_line(sys.argv),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
