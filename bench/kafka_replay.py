"""Replay on Kafka: facts/s rebuilding projections from runs.facts, against a bare consume.

Run: ``PYTHONPATH=. python bench/kafka_replay.py --bootstrap 127.0.0.1:9092
[--facts 1000000] [--template-runs 2000] [--repeat 3] [--processes 1,2] [--json]``

1. Facts: ``--template-runs`` runs of the bundled ``orders`` pipeline go through the
   engine on Kafka (processor, one worker and the payment responder as separate
   processes; bench/kafka_support.py), so the fact mix (types, sizes, the retry of one
   order in five, the await) is whatever the engine writes today. Their runs.facts is
   then replicated with fresh run ids (a 36-character id replaced in place by another,
   so the Avro stays valid) into a fresh 4-partition runs.facts, keyed by the new run
   id (murmur2), each run's facts in order, produced by a transactional producer in
   transactions of ``--txn-facts`` facts, until it holds at least ``--facts`` facts.
2. Measures, alternately, ``--repeat`` times:
   (a) bare consume: one confluent-kafka consumer (read_committed, the reader's fetch
       settings) assigned all 4 partitions, draining with ``consume(10000, 0)`` and
       blocking in ``poll`` only when empty, touching every value, until every
       partition's EOF event;
   (b) ``processor.restore.replay.replay`` of every partition into fresh stores, with each
       ``--processes`` value (1: the serial loop; N > 1: partitions rebuilt by N
       processes, if this version of replay supports it);
   the ratio is replay / bare (medians). Each side is timed like for like: the bare
   consume from its assign to the last EOF (not creating or closing the consumer),
   the replay by its own report (``ReplayReport.seconds``: from the first partition's
   catch-up to the last store closed, pool processes included; not creating the
   reader, asking for end offsets, closing it or removing the scratch stores), as
   ``bench/replay_embedded.py`` does. The wall time around the whole call is reported
   too (``replay_call_facts_per_s``).

Replay folds with the compiled fold (``processor_native``) when it is installed;
``PROCESSOR_NATIVE_FOLD=false`` measures the Python reducers instead.

``--reuse-prefix P`` reuses the runs.facts topic of an earlier ``--keep`` run (and
leaves it there).
``--digest`` hashes every column family of the stores rebuilt by each mode (they must
be equal, and equal across code versions). ``--profile FILE`` writes cProfile stats
of one extra serial replay.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import heapq
import inspect
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from _support import command_line, digest, machine_cpu_seconds, per_cpu_second
from confluent_kafka import Consumer, KafkaError, Message, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from kafka_support import (
    broker_pid,
    create_topic,
    delete_topics,
    engine,
    measure_runs,
    summary_head,
    unique_prefix,
    wait_until_stable,
)

from processor.config.settings import Settings
from processor.facts.topics import TopicName
from processor.restore.replay import ReplayReport, replay
from processor.store.native_fold import native_fold_available
from processor.transport.base import TopicPartition
from processor.transport.factory import open_transport
from processor.transport.gc_pause import gc_paused
from processor.transport.kafka import PRODUCER_CONFIG
from processor.transport.kafka_reader import READER_CONFIG
from processor.transport.topology import Topology

PARTITIONS = 4
_EOF = KafkaError._PARTITION_EOF
_COPY_NAMESPACE = uuid.UUID("6c1f5d2e-8a4b-4e3c-9d7f-1b2a3c4d5e6f")


def build_template(bootstrap: str, prefix: str, root: Path, runs: int) -> list[tuple[bytes, bytes]]:
    """Run ``runs`` runs on the Kafka engine; their facts as (run id, value) in commit order."""
    with engine(bootstrap, prefix, root) as running:
        running.warm_up(20)
        measure_runs(running, runs, timeout_s=900)
        time.sleep(1.0)  # let the terminal-publication facts of the last runs commit
        transport = running.deployment.transport
        topic = running.deployment.topology.name(TopicName.FACTS)
        reader = transport.reader()
        parts = []
        for partition in range(running.deployment.topology.partitions):
            rows = []
            for batch in reader.read(TopicPartition(topic, partition), 0):
                rows += [(r.timestamp_ms, r.offset, r.key or b"", r.value or b"") for r in batch]
            parts.append(rows)
        reader.close()
    # heapq.merge keeps each partition's own order, so every run's facts stay in order.
    merged = heapq.merge(*parts, key=lambda row: row[0])
    return [(key, value) for _, _, key, value in merged]


def replicate(
    bootstrap: str, topic: str, template: list[tuple[bytes, bytes]], wanted: int, txn: int
) -> int:
    """Produce copies of ``template`` with fresh run ids, in transactions, until ``wanted``."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-fill"}
        | PRODUCER_CONFIG
        | {"linger.ms": 20, "batch.size": 1_000_000}
    )
    producer.init_transactions()
    produced = copy = in_txn = 0
    producer.begin_transaction()
    while produced < wanted:
        renamed: dict[bytes, bytes] = {}
        for old, value in template:
            new = renamed.get(old)
            if new is None:
                new = str(uuid.uuid5(_COPY_NAMESPACE, f"{copy}/{old.decode()}")).encode()
                if len(new) != len(old) or old not in value:
                    raise ValueError(f"run id {old!r} cannot be substituted in place")
                renamed[old] = new
            while True:
                try:
                    producer.produce(topic, value.replace(old, new), new)
                    break
                except BufferError:
                    producer.poll(0.05)
            in_txn += 1
            if in_txn == txn:
                producer.commit_transaction()
                producer.begin_transaction()
                in_txn = 0
        produced += len(template)
        copy += 1
    producer.commit_transaction()
    wait_until_stable(bootstrap, topic, PARTITIONS)
    return produced


def bare_consume(bootstrap: str, topic: str) -> tuple[int, int, float, float]:
    """(a) Every record of every partition, touching each value, with the collector
    paused from each consume until its messages are freed, as the reader replay uses
    does (``KafkaReader._next``): both read the same way.

    (count, bytes, wall seconds, CPU seconds).
    """
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}"} | READER_CONFIG
    )
    cpu = machine_cpu_seconds()
    started = time.perf_counter()
    consumer.assign([KafkaTopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    count = size = 0
    ended: set[int] = set()
    while len(ended) < PARTITIONS:
        with gc_paused():
            messages = consumer.consume(10_000, 0)
            waiting = not messages
            count, size = _touch(messages, count, size, ended)
            del messages
        if waiting and (first := consumer.poll(1.0)) is not None:
            count, size = _touch([first], count, size, ended)
    seconds = time.perf_counter() - started
    cpu = machine_cpu_seconds() - cpu
    consumer.close()
    return count, size, seconds, cpu


def _touch(messages: list[Message], count: int, size: int, ended: set[int]) -> tuple[int, int]:
    """Count and measure the records of ``messages``; add the partitions that ended."""
    for msg in messages:
        err = msg.error()
        if err is None:
            size += len(msg.value())
            count += 1
        elif err.code() == _EOF:
            ended.add(msg.partition())
    return count, size


def supports_processes() -> bool:
    return "processes" in inspect.signature(replay).parameters


def replay_once(
    settings: Settings, topology: Topology, processes: int, target: Path | None
) -> tuple[ReplayReport, float, float]:
    """(b) processor.restore.replay.replay of every partition; (its report, wall seconds around
    the call, CPU seconds of the machine around the call)."""
    if target is not None:
        shutil.rmtree(target, ignore_errors=True)
    transport = open_transport(settings)
    extra: dict[str, Any] = {"processes": processes} if supports_processes() else {}
    if "native_fold" in inspect.signature(replay).parameters:
        extra["native_fold"] = settings.native_fold  # PROCESSOR_NATIVE_FOLD=false: Python
    cpu = machine_cpu_seconds()
    started = time.perf_counter()
    report = replay(transport, topology, Path("/nonexistent"), target_dir=target, **extra)
    seconds = time.perf_counter() - started
    return report, seconds, machine_cpu_seconds() - cpu


def prepare(args: argparse.Namespace, prefix: str, root: Path, say: Any) -> int:
    """Fill ``{prefix}runs.facts`` (unless reused); return how many facts it holds."""
    topology = Topology(prefix=prefix, partitions=PARTITIONS)
    topic = topology.name(TopicName.FACTS)
    transport = open_transport(settings_for(args, prefix))
    if args.reuse_prefix:
        reader = transport.reader()
        have = sum(reader.end_offset(TopicPartition(topic, p)) for p in range(PARTITIONS))
        reader.close()
        say(f"reusing {topic}: {have:,} offsets (facts plus transaction markers)")
        return have
    started = time.perf_counter()
    template = build_template(args.bootstrap, f"{prefix}template.", root, args.template_runs)
    say(
        f"template: {args.template_runs:,} runs on the Kafka engine, {len(template):,} facts "
        f"in {time.perf_counter() - started:.1f}s"
    )
    create_topic(args.bootstrap, topic, PARTITIONS)
    started = time.perf_counter()
    have = replicate(args.bootstrap, topic, template, args.facts, args.txn_facts)
    say(f"replicated to {have:,} facts in {time.perf_counter() - started:.1f}s")
    return have


def settings_for(args: argparse.Namespace, prefix: str) -> Settings:
    return Settings(broker=f"kafka://{args.bootstrap}", topic_prefix=prefix)


def measure(args: argparse.Namespace, prefix: str, root: Path, say: Any) -> dict[str, Any]:
    settings = settings_for(args, prefix)
    topology = Topology(prefix=prefix, partitions=PARTITIONS)
    topic = topology.name(TopicName.FACTS)
    modes = [p for p in args.processes if p == 1 or supports_processes()]
    bare: list[float] = []
    bare_cpu: list[float] = []
    rates: dict[int, list[float]] = {p: [] for p in modes}
    call_rates: dict[int, list[float]] = {p: [] for p in modes}
    cpu_rates: dict[int, list[float]] = {p: [] for p in modes}
    digests: dict[int, dict[str, str]] = {}
    facts = runs = 0
    for index in range(args.repeat):
        count, size, seconds, cpu = bare_consume(args.bootstrap, topic)
        bare.append(count / seconds)
        bare_cpu.append(per_cpu_second(count, cpu))
        say(
            f"(a) bare consume: {count:,} records, {size / 1e6:.0f} MB in {seconds:.2f}s "
            f"(CPU {cpu:.2f}s)"
        )
        for processes in modes:
            target = root / f"replayed-{processes}" if args.digest and index == 0 else None
            report, call_seconds, cpu = replay_once(settings, topology, processes, target)
            facts, runs = report.facts, report.runs
            rates[processes].append(report.facts_per_s)
            call_rates[processes].append(facts / call_seconds)
            cpu_rates[processes].append(per_cpu_second(facts, cpu))
            say(
                f"(b) replay, {processes} process(es): {facts:,} facts, {runs:,} runs in "
                f"{report.seconds:.2f}s ({call_seconds:.2f}s around the call; CPU {cpu:.2f}s)"
            )
            if target is not None:
                digests[processes] = {f: h[:16] for f, h in digest(target, PARTITIONS).items()}
                shutil.rmtree(target, ignore_errors=True)
            if facts != count:
                raise AssertionError(f"replayed {facts} facts, consumed {count}")
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        replay_once(settings, topology, 1, None)
        profiler.disable()
        profiler.dump_stats(args.profile)
        say(f"profile written to {args.profile}")
    bare_rate = statistics.median(bare)
    medians = {p: statistics.median(r) for p, r in rates.items()}
    bare_cpu_rate = statistics.median(bare_cpu)
    cpu_medians = {p: statistics.median(r) for p, r in cpu_rates.items()}
    return {
        "facts": facts,
        "runs": runs,
        "facts_per_run": round(facts / runs, 2) if runs else None,
        "bare_consume_facts_per_s": round(bare_rate),
        "replay_facts_per_s": {str(p): round(r) for p, r in medians.items()},
        "ratio_replay_to_bare": {str(p): round(r / bare_rate, 3) for p, r in medians.items()},
        "target_ratio": 0.5,
        "compiled_fold": settings.native_fold and native_fold_available(),
        "bare_consume_facts_per_cpu_s": round(bare_cpu_rate),
        "replay_facts_per_cpu_s": {str(p): round(r) for p, r in cpu_medians.items()},
        "cpu_ratio_replay_to_bare": {
            str(p): round(r / bare_cpu_rate, 3) for p, r in cpu_medians.items()
        },
        "bare_samples": [round(r) for r in bare],
        "replay_samples": {str(p): [round(r) for r in v] for p, v in rates.items()},
        "replay_call_facts_per_s": {
            str(p): round(statistics.median(v)) for p, v in call_rates.items()
        },
        "digests": {str(p): d for p, d in digests.items()} or None,
        "digests_equal": len({json.dumps(d) for d in digests.values()}) <= 1 if digests else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--facts", type=int, default=1_000_000)
    parser.add_argument("--template-runs", type=int, default=2_000)
    parser.add_argument("--txn-facts", type=int, default=1_000, help="facts per transaction")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--processes",
        type=lambda text: [int(p) for p in text.split(",")],
        default=[1, 2],
        help="replay modes to measure, e.g. 1,2 (serial and 2 processes)",
    )
    parser.add_argument("--reuse-prefix", help="reuse the facts of an earlier --keep run")
    parser.add_argument("--keep", action="store_true", help="keep the facts topic")
    parser.add_argument("--digest", action="store_true", help="hash every rebuilt column family")
    parser.add_argument("--profile", type=Path, help="cProfile stats of one extra replay")
    parser.add_argument("--json", action="store_true", help="only the one-line JSON summary")
    args = parser.parse_args()
    say = (lambda *_: None) if args.json else functools.partial(print, flush=True)
    command = command_line(sys.argv)
    say(f"$ {command}")
    broker = broker_pid()  # a shared broker: notice if it restarts mid-run
    prefix = args.reuse_prefix or unique_prefix("replay")
    root = Path(tempfile.mkdtemp(prefix="bench-kafka-replay-"))
    say(f"topic prefix {prefix}")
    try:
        have = prepare(args, prefix, root, say)
        if args.repeat < 1:
            print(json.dumps({"bench": "kafka_replay", "prefix": prefix, "facts": have}))
            return
        result = measure(args, prefix, root, say)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if args.reuse_prefix:
            pass  # an earlier run's topic: it stays for the next run to reuse
        elif args.keep:
            delete_topics(args.bootstrap, f"{prefix}template.")
        else:
            delete_topics(args.bootstrap, prefix)
    for processes, rate in result["replay_facts_per_s"].items():
        say(
            f"replay ({processes} process(es)) {rate:,} facts/s, bare consume "
            f"{result['bare_consume_facts_per_s']:,} facts/s: ratio "
            f"{result['ratio_replay_to_bare'][processes]} (target >= 0.5)"
        )
    summary = {
        **summary_head("kafka_replay", broker, say),
        "prefix": prefix if args.keep or args.reuse_prefix else None,
        "repeat": args.repeat,
        **result,
        "command": command,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
