"""The floor of a standard run at C=1 on Kafka: its hops and transactions, no engine.

Run: ``PYTHONPATH=. python bench/kafka_transaction_floor.py --bootstrap 127.0.0.1:9092
[--runs 1000] [--warmup 200] [--facts 8] [--json]``.

What a standard run needs of Kafka when the processor runs its steps itself
(``PROCESSOR_INLINE_STEPS``, BENCHMARKS.md row 19), done with bare confluent-kafka
clients in threads of one process, with the product's client settings and nothing
decided, encoded or stored:

1. the client produces a command (an idempotent producer, flushed);
2. the "processor" (a read_committed group member with a transactional producer)
   consumes it and commits one transaction: ``--facts`` records to a facts topic and a
   request, with the consumed offset;
3. the "responder" consumes the request and produces a completion (flushed);
4. the processor consumes it and commits ``--facts`` records and the outcome;
5. the client consumes the outcome (read_committed), and submits the next run.

The p50 of that loop is what the product's C=1 p50 cannot go below on this broker
with this protocol (librdkafka's transactions: partitions and offsets are added to a
transaction by requests of their own before it ends). The last line is a one-line
JSON summary (``--json``: only that line).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid
from typing import Any

from _support import command_line, percentile
from confluent_kafka import Consumer, Message, Producer
from kafka_support import create_topic, delete_topics, wait_until_stable

from processor.transport.kafka import PRODUCER_CONFIG

_POLL_S = 0.5
_TOPICS = ("commands", "requests", "completions", "outcomes", "facts")


def _consumer(bootstrap: str, group: str, topics: list[str]) -> Consumer:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe(topics)
    return consumer


def _next(consumer: Consumer, stop: threading.Event) -> Message | None:
    while not stop.is_set():
        message = consumer.poll(_POLL_S)
        if message is not None and message.error() is None:
            return message
    return None


def _processor(
    bootstrap: str, names: dict[str, str], facts: int, ready: threading.Event, stop: threading.Event
) -> None:
    consumer = _consumer(bootstrap, names["group"], [names["commands"], names["completions"]])
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": names["group"]} | PRODUCER_CONFIG
    )
    producer.init_transactions()
    ready.set()
    fact = b"f" * 200
    try:
        while (message := _next(consumer, stop)) is not None:
            key = message.key()
            producer.begin_transaction()
            for _ in range(facts):
                producer.produce(names["facts"], fact, key)
            answer = "requests" if message.topic() == names["commands"] else "outcomes"
            producer.produce(names[answer], message.value(), key)
            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()), consumer.consumer_group_metadata()
            )
            producer.commit_transaction()
    finally:
        consumer.close()


def _responder(
    bootstrap: str, names: dict[str, str], ready: threading.Event, stop: threading.Event
) -> None:
    consumer = _consumer(bootstrap, names["group"] + "-responder", [names["requests"]])
    producer = Producer({"bootstrap.servers": bootstrap} | PRODUCER_CONFIG)
    ready.set()
    try:
        while (message := _next(consumer, stop)) is not None:
            producer.produce(names["completions"], message.value(), message.key())
            producer.flush()
    finally:
        consumer.close()


def measure(bootstrap: str, runs: int, warmup: int, facts: int) -> dict[str, Any]:
    prefix = f"bench-floor-{uuid.uuid4().hex[:8]}."
    names = {topic: prefix + topic for topic in _TOPICS}
    names["group"] = prefix + "processor"
    for topic in _TOPICS:
        create_topic(bootstrap, names[topic], 1)
        wait_until_stable(bootstrap, names[topic], 1)
    stop = threading.Event()
    readies = [threading.Event(), threading.Event()]
    actors = [
        threading.Thread(target=_processor, args=(bootstrap, names, facts, readies[0], stop)),
        threading.Thread(target=_responder, args=(bootstrap, names, readies[1], stop)),
    ]
    for actor in actors:
        actor.start()
    outcomes = _consumer(bootstrap, prefix + "client", [names["outcomes"]])
    client = Producer({"bootstrap.servers": bootstrap} | PRODUCER_CONFIG)
    latencies: list[float] = []
    try:
        for ready in readies:
            if not ready.wait(60):
                raise TimeoutError("an actor did not start")
        for index in range(warmup + runs):
            key = str(index).encode()
            started = time.perf_counter()
            client.produce(names["commands"], b"c" * 100, key)
            client.flush()
            message = _next(outcomes, stop)
            if message is None or message.key() != key:
                raise RuntimeError(f"run {index}: outcome {message and message.key()!r}")
            if index >= warmup:
                latencies.append((time.perf_counter() - started) * 1000)
    finally:
        stop.set()
        for actor in actors:
            actor.join(10)
        outcomes.close()
        delete_topics(bootstrap, prefix)
    latencies.sort()
    return {
        "runs": runs,
        "facts_per_commit": facts,
        "p50_ms": percentile(latencies, 0.50),
        "p95_ms": percentile(latencies, 0.95),
        "p99_ms": percentile(latencies, 0.99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--facts", type=int, default=8, help="fact records a transaction")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(args.bootstrap, args.runs, args.warmup, args.facts)
    if not args.json:
        print(
            f"floor: p50 {result['p50_ms']:.1f} ms, p95 {result['p95_ms']:.1f}, "
            f"p99 {result['p99_ms']:.1f} ({args.runs} runs, {args.facts} facts a commit)"
        )
    summary = {"bench": "kafka_transaction_floor"} | result
    print(json.dumps(summary | {"command": command_line(sys.argv)}))


if __name__ == "__main__":
    main()
