"""Reader.read throughput on Kafka against a bare confluent-kafka consume loop.

Run: ``PYTHONPATH=. python bench/kafka_read_throughput.py --bootstrap 127.0.0.1:9092
[--records 1000000] [--passes 3] [--json]``.

Fills a fresh one-partition topic with ``--records`` small records (~100-byte
values, a run-id key, one header; produced in transactions of 10,000 records so
commit markers sit between them, like ``runs.facts``), then reads the whole
partition, alternately, with

- ``KafkaReader.read`` (``Record`` objects in batches of 10,000; what replay and
  restore use), and
- a bare loop: ``consume(num_messages=10000)`` on a read_committed consumer with
  the same fetch settings, touching ``msg.value()`` of every message and stopping
  at the partition EOF event.

Each figure is the best of ``--passes`` passes, in records/s of wall-clock time
and of this process's CPU time; the ratio is Reader/bare on wall-clock time. The
last line is a one-line JSON summary (``--json``: only that line).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import Callable
from typing import NamedTuple

from _support import command_line
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient
from kafka_support import wait_until_stable

from processor.config.settings import Settings
from processor.transport.base import TopicPartition, TopicSpec
from processor.transport.kafka import PRODUCER_CONFIG, KafkaTransport
from processor.transport.kafka_reader import READER_CONFIG

BATCH = 10_000
VALUE = b"x" * 100


class Rate(NamedTuple):
    """Records per second of wall-clock time and of process CPU time."""

    wall: float
    cpu: float

    def __str__(self) -> str:
        return f"{self.wall:>12,.0f} records/s  ({self.cpu:>12,.0f} per CPU-second)"


def measure(work: Callable[[], int]) -> Rate:
    """Run ``work`` (which returns the records it read) and turn it into a rate."""
    wall, cpu = time.perf_counter(), time.process_time()
    count = work()
    return Rate(count / (time.perf_counter() - wall), count / (time.process_time() - cpu))


def fill(bootstrap: str, topic: str, records: int) -> None:
    """Produce ``records`` records in transactions of ``BATCH`` records."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"bench-{topic}"}
        | PRODUCER_CONFIG
        | {"linger.ms": 20, "batch.size": 1_000_000}
    )
    producer.init_transactions()
    headers = [("type", b"SegmentCompleted")]
    for first in range(0, records, BATCH):
        producer.begin_transaction()
        for index in range(first, min(first + BATCH, records)):
            while True:
                try:
                    producer.produce(
                        topic, VALUE, b"run-%08d" % (index % 1000), partition=0, headers=headers
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.commit_transaction()
    wait_until_stable(bootstrap, topic, 1)


def read_with_reader(transport: KafkaTransport, tp: TopicPartition, expected: int) -> int:
    """Every record of ``tp`` through ``KafkaReader.read``."""
    reader = transport.reader()
    try:
        count = 0
        for batch in reader.read(tp, 0, batch_size=BATCH):
            count += len(batch)
    finally:
        reader.close()
    assert count == expected, (count, expected)
    return count


def read_bare(bootstrap: str, tp: TopicPartition, expected: int) -> int:
    """Every record of ``tp`` through a bare consume loop touching each value."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}"} | READER_CONFIG
    )
    try:
        consumer.assign([KafkaTopicPartition(tp.topic, tp.partition, 0)])
        count = 0
        size = 0
        done = False
        while not done:
            # consume() waits until it has num_messages: ask for no more than the
            # records left plus the EOF event, so the last call does not sit out
            # its timeout (a loop that did not know the count would).
            wanted = min(BATCH, expected - count + 1)
            for msg in consumer.consume(num_messages=wanted, timeout=10.0):
                err = msg.error()
                if err is not None:
                    done = err.code() == KafkaError._PARTITION_EOF
                    continue
                size += len(msg.value() or b"")
                count += 1
    finally:
        consumer.close()
    assert count == expected and size == expected * len(VALUE), (count, expected)
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="only the one-line JSON summary")
    args = parser.parse_args()
    say = (lambda *_: None) if args.json else print

    transport = KafkaTransport(Settings(broker=f"kafka://{args.bootstrap}"))
    topic = f"bench.read.{uuid.uuid4().hex[:8]}"
    admin = transport.admin()
    admin.create_topics([TopicSpec(topic, 1)])
    admin.close()
    try:
        started = time.perf_counter()
        fill(args.bootstrap, topic, args.records)
        elapsed = time.perf_counter() - started
        say(f"filled {topic} with {args.records:,} records in {elapsed:.1f}s")
        tp = TopicPartition(topic, 0)
        reader_rates: list[Rate] = []
        bare_rates: list[Rate] = []
        for _ in range(args.passes):
            bare_rates.append(measure(lambda: read_bare(args.bootstrap, tp, args.records)))
            reader_rates.append(measure(lambda: read_with_reader(transport, tp, args.records)))
    finally:
        cleaner = AdminClient({"bootstrap.servers": args.bootstrap})
        cleaner.delete_topics([topic])[topic].result()  # keep the client alive until done
    reader, bare = max(reader_rates), max(bare_rates)
    say(f"Reader.read  {reader}")
    say(f"bare consume {bare}")
    say(f"ratio        {reader.wall / bare.wall:.2f} (wall), {reader.cpu / bare.cpu:.2f} (CPU)")
    summary = {
        "bench": "kafka_read_throughput",
        "records": args.records,
        "reader_records_per_s": round(reader.wall),
        "bare_records_per_s": round(bare.wall),
        "ratio_reader_to_bare": round(reader.wall / bare.wall, 3),
        "reader_records_per_cpu_s": round(reader.cpu),
        "bare_records_per_cpu_s": round(bare.cpu),
        "command": command_line(sys.argv),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
