"""Trigger ingress on Kafka: user records/s turned into runs, against a raw consume of them.

Run: ``PYTHONPATH=. python bench/kafka_trigger_ingress.py --bootstrap 127.0.0.1:9092
[--records 100000] [--partitions 3] [--repeat 3] [--keep] [--json]``

Setup: a fresh topic prefix with the deployment's topics, and a user topic of
``--partitions`` partitions filled once with ``--records`` JSON records (keys are
customer ids, as a user's application would produce them; about 120 bytes each).
Then, ``--repeat`` times, alternated in the same process:

(a) raw consume: a bare confluent-kafka consumer (read_committed, subscribed in a
    fresh group, like the trigger stage) reads the whole user topic in batches of
    500; timed from the start of the first ``consume`` that returned records to
    the last record;
(b) trigger: ``processor.engine.trigger.TriggerStage`` (the stage ``processor run``
    starts for an application with triggers; here with a ``Trigger`` mapping
    ``{"n": ...}`` to the run input) in a fresh group reads the whole topic and
    commits one SubmitRun per record to runs.commands, with the consumed offsets,
    transaction by transaction (``PROCESSOR_MAX_BATCH`` records each); timed from
    the start of the first poll that returned records (it waits at most the poll
    timeout, 50 ms, for them) to the last commit (whose SubmitRuns are then
    visible to read_committed readers).

records/s = records / time; the figure is the median of the trigger's rounds,
the baseline the median of the raw consume's, the ratio their quotient. The
processor loop is not running: this measures the ingress alone (runs.commands
is where a run starts).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from _support import command_line
from confluent_kafka import Consumer, Producer
from kafka_support import (
    bench_settings,
    broker_pid,
    create_topic,
    deployment_for,
    summary_head,
    temporary_topics,
    unique_prefix,
    wait_until_stable,
)

from processor.config.settings import Settings
from processor.engine.trigger import TriggerStage
from processor.transport.deployment import Deployment
from processor.transport.kafka import PRODUCER_CONFIG
from processor.worker.trigger import Trigger, TriggerRecord

BENCH = "kafka_trigger_ingress"


def order_input(rec: TriggerRecord) -> dict[str, Any]:
    return {"n": rec.decoded["n"]}


def fill(bootstrap: str, topic: str, records: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap} | PRODUCER_CONFIG)
    for index in range(records):
        value = json.dumps({"n": index, "customer": f"c-{index % 997}", "pad": "x" * 64})
        producer.produce(topic, value.encode(), f"customer-{index % 997}".encode())
        if index % 10_000 == 0:
            producer.poll(0)
    producer.flush()


def raw_consume(bootstrap: str, topic: str, records: int) -> float:
    """Seconds of a bare read_committed group consume, timed as the trigger round is."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-raw-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    count, first = 0, 0.0
    deadline = time.monotonic() + 300
    try:
        while count < records:
            if time.monotonic() > deadline:
                raise TimeoutError(f"raw consume: {count} of {records} records")
            called = time.perf_counter()
            messages = consumer.consume(500, 0.05)  # the stage's batch (PROCESSOR_MAX_BATCH)
            if messages and not first:
                first = called
            count += sum(1 for msg in messages if msg.error() is None)
        return time.perf_counter() - first
    finally:
        consumer.close()


def trigger_round(deployment: Deployment, topic: str, records: int) -> float:
    """Seconds from the stage's first records to its last commit, in a fresh group."""
    settings = deployment.settings.model_copy(update={"group": f"bench-{uuid.uuid4().hex[:8]}"})
    stage = TriggerStage(
        deployment.transport,
        deployment.topology,
        settings,
        [("orders", Trigger(topic, order_input))],
        instance_id="bench",
    )
    first = 0.0
    deadline = time.monotonic() + 300
    try:
        while stage.submitted + stage.rejected < records:
            if time.monotonic() > deadline:
                raise TimeoutError(f"trigger: {stage.submitted} of {records} records submitted")
            called = time.perf_counter()
            if stage.run_once() and not first:
                first = called
        if stage.rejected:
            raise AssertionError(f"{stage.rejected} records rejected")
        return time.perf_counter() - first
    finally:
        stage.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the topics afterwards")
    parser.add_argument("--json", action="store_true", help="only the one-line JSON summary")
    args = parser.parse_args()
    say = (lambda *_: None) if args.json else print

    prefix = unique_prefix("trigger")
    topic = f"{prefix}user.orders"
    with tempfile.TemporaryDirectory() as data, temporary_topics(args.bootstrap, prefix, args.keep):
        settings: Settings = bench_settings(args.bootstrap, prefix, Path(data))
        deployment = deployment_for(settings)
        create_topic(args.bootstrap, topic, args.partitions)
        started = time.perf_counter()
        fill(args.bootstrap, topic, args.records)
        wait_until_stable(args.bootstrap, topic, args.partitions)
        say(f"filled {topic} with {args.records:,} records in {time.perf_counter() - started:.1f}s")
        broker = broker_pid()
        raw, trig = [], []
        for round_ in range(args.repeat):
            raw.append(args.records / raw_consume(args.bootstrap, topic, args.records))
            trig.append(args.records / trigger_round(deployment, topic, args.records))
            say(f"round {round_ + 1}: raw {raw[-1]:,.0f} records/s, trigger {trig[-1]:,.0f}/s")
        summary = summary_head(BENCH, broker, say)
    figure, baseline = statistics.median(trig), statistics.median(raw)
    say(f"trigger {figure:,.0f} runs/s; raw consume {baseline:,.0f} records/s")
    say(f"ratio {figure / baseline:.3f}")
    summary |= {
        "records": args.records,
        "partitions": args.partitions,
        "rounds": args.repeat,
        "trigger_runs_per_s": round(figure),
        "raw_consume_records_per_s": round(baseline),
        "ratio": round(figure / baseline, 4),
        "command": command_line(sys.argv),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
