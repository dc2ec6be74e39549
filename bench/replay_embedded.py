"""Replay throughput on the embedded log, against a raw read of the same facts.

Run: ``PYTHONPATH=. python bench/replay_embedded.py [--facts 1000000] [--data-dir DIR] [--json]``

1. Builds (or reuses, with ``--data-dir``) a ``runs.facts`` topic of at least
   ``--facts`` facts, synthesized directly with the fact models and
   ``processor.facts.codec.encode`` in exactly the sequences ``decide`` produces
   for the bundled order pipeline (``processor.examples.demo``): most runs
   succeed in one attempt (7 facts), one in five fails ``reserve_stock`` once
   and is retried (10 facts), one in 200 fails validation for good (4 facts).
   Runs are produced in waves of ``--concurrency`` runs whose decisions
   interleave in the log, as they do live; keyed by run id over 4 partitions.
2. Measures (a) a raw read: every record of runs.facts through
   ``transport.reader().read()``, touching each value; (b) ``processor.replay.replay``
   into a fresh store. Prints facts/s of both and the ratio (b)/(a) (target >= 0.5).

``--repeat N`` alternates (a) and (b) N times and reports medians. ``--profile FILE``
writes cProfile stats of one extra replay. ``--digest`` prints a SHA-256 of every
column family of the rebuilt stores, to prove an optimization writes the same bytes.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
import zlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from processor.facts import keys
from processor.facts.codec import encode
from processor.facts.models import (
    FactHeader,
    RetryScheduled,
    RunFailed,
    RunSubmitted,
    RunSucceeded,
    SegmentAttemptStarted,
    SegmentCompleted,
    SegmentFailed,
    StepCompleted,
)
from processor.facts.payload import dumps
from processor.facts.topics import TopicName
from processor.replay import replay
from processor.store.rocks import COLUMN_FAMILIES, PartitionStore
from processor.topology import Topology
from processor.transport.base import Outbound, TopicPartition
from processor.transport.embedded import EmbeddedTransport

PARTITIONS = 4
# Segment timeouts of the demo pipeline: validate 10 s, reserve_stock and invoice 30 s.
STEP_TIMEOUT_MS = (10_000, 30_000, 30_000)
Decision = list[FactHeader]


class _Maker:
    """Stamps facts like decide's _FactMaker: run id, next seq, time, cause."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.seq = 0

    def decision(self, now: int, cause: str, *parts: tuple[type[FactHeader], str, dict[str, Any]]):
        facts: Decision = []
        for fact_type, fact_key, body in parts:
            self.seq += 1
            facts.append(
                fact_type(
                    run_id=self.run_id,
                    seq=self.seq,
                    fact_key=fact_key,
                    time_ms=now,
                    cause_id=cause,
                    **body,
                )
            )
        return facts


def _attempt(segment: int, attempt: int, generation: int, first: int, now: int) -> tuple:
    body = {
        "segment": segment,
        "attempt": attempt,
        "generation": generation,
        "first_step": first,
        "expires_ms": now + sum(STEP_TIMEOUT_MS[first:]),
    }
    return (SegmentAttemptStarted, keys.attempt_started(segment, generation), body)


def _step(step: int, attempt: int, generation: int, output: bytes) -> tuple:
    body = {"segment": 1, "attempt": attempt, "generation": generation, "step": step}
    return (StepCompleted, keys.step_completed(step), {**body, "output": output})


def run_decisions(index: int, t0: int) -> list[Decision]:
    """The decisions (lists of facts) of one demo-pipeline run, in log order."""
    run_id = str(uuid.UUID(int=(index * 0x9E3779B97F4A7C15) % (1 << 128), version=4))
    order_id = f"order-{index:07d}"
    amount = 0 if index % 200 == 199 else 10 + index % 90
    order = {"order_id": order_id, "amount": amount}
    validated = {**order, "amount": float(amount)}
    reserved = {**validated, "reserved": True}
    invoiced = {"order_id": order_id, "total": round(amount * 1.2, 2), "status": "invoiced"}
    outputs = (dumps(validated), dumps(reserved), dumps(invoiced))
    maker = _Maker(run_id)
    submitted = {
        "pipeline": "orders",
        "pipeline_version": 1,
        "input": dumps(order),
        "idempotency_key": None,
        "fingerprint": None,
        "submitted_ms": t0 - 3,
    }
    decisions = [
        maker.decision(
            t0,
            str(uuid.uuid4()),
            (RunSubmitted, keys.SUBMITTED, submitted),
            _attempt(1, 1, 1, 0, t0),
        )
    ]
    t1 = t0 + 40
    if amount <= 0:
        error = f"order {order_id}: amount must be positive"
        failed = {"segment": 1, "attempt": 1, "generation": 1, "step": 0}
        failed |= {"error": error, "error_type": "NonRetryableError", "retryable": False}
        run_failed = {"error": error, "error_type": "NonRetryableError", "step": 0, "attempts": 1}
        decisions.append(
            maker.decision(
                t1,
                str(uuid.uuid4()),
                (SegmentFailed, keys.attempt_failed(1, 1), failed),
                (RunFailed, keys.TERMINAL, run_failed),
            )
        )
        return decisions
    if zlib.crc32(order_id.encode()) % 5 == 0:  # reserve_stock fails once, then retries
        failed = {"segment": 1, "attempt": 1, "generation": 1, "step": 1}
        failed |= {
            "error": f"inventory busy for order {order_id}",
            "error_type": "InventoryBusyError",
            "retryable": True,
        }
        retry = {"segment": 1, "attempt": 2, "due_ms": t1 + 20}
        decisions.append(
            maker.decision(
                t1,
                str(uuid.uuid4()),
                _step(0, 1, 1, outputs[0]),
                (SegmentFailed, keys.attempt_failed(1, 1), failed),
                (RetryScheduled, keys.retry_scheduled(1, 1), retry),
            )
        )
        t2 = t1 + 100
        cause = f"timer/retry/{run_id}/1/1"
        decisions.append(maker.decision(t2, cause, _attempt(1, 2, 2, 1, t2)))
        t3 = t2 + 40
        decisions.append(
            maker.decision(
                t3,
                str(uuid.uuid4()),
                _step(1, 2, 2, outputs[1]),
                _step(2, 2, 2, outputs[2]),
                (SegmentCompleted, keys.segment_completed(1), _completed(2, 2)),
                (RunSucceeded, keys.TERMINAL, {"result": outputs[2]}),
            )
        )
        return decisions
    decisions.append(
        maker.decision(
            t1,
            str(uuid.uuid4()),
            *(_step(step, 1, 1, outputs[step]) for step in range(3)),
            (SegmentCompleted, keys.segment_completed(1), _completed(1, 1)),
            (RunSucceeded, keys.TERMINAL, {"result": outputs[2]}),
        )
    )
    return decisions


def _completed(attempt: int, generation: int) -> dict[str, int]:
    return {"segment": 1, "attempt": attempt, "generation": generation, "last_step": 2}


def build_facts(transport: EmbeddedTransport, topic: str, facts: int, concurrency: int) -> int:
    """Produce at least ``facts`` facts in waves of ``concurrency`` interleaved runs."""
    producer = transport.producer()
    produced = 0
    index = 0
    t0 = 1_767_225_600_000  # 2026-01-01
    while produced < facts:
        wave = [run_decisions(index + i, t0 + 5 * i) for i in range(concurrency)]
        index += concurrency
        t0 += 5 * concurrency + 500
        for step in range(max(len(d) for d in wave)):  # decision k of every run, then k+1
            for decisions in wave:
                if step < len(decisions):
                    for fact in decisions[step]:
                        key = fact.run_id.encode()
                        producer.produce(Outbound(topic, key, encode(fact)))
                        produced += 1
    producer.close()
    return produced


def raw_read(transport: EmbeddedTransport, topic: str) -> tuple[int, int, float]:
    """(a) Every record of every partition through Reader.read, touching each value."""
    reader = transport.reader()
    started = time.perf_counter()
    count = size = 0
    for partition in range(PARTITIONS):
        for records in reader.read(TopicPartition(topic, partition), 0):
            for record in records:
                size += len(record.value or b"")
            count += len(records)
    seconds = time.perf_counter() - started
    reader.close()
    return count, size, seconds


def replay_once(transport: EmbeddedTransport, topology: Topology, target: Path | None) -> Any:
    """(b) processor.replay.replay of every partition into a fresh store."""
    if target is not None:
        shutil.rmtree(target, ignore_errors=True)
    return replay(transport, topology, Path("/nonexistent"), target_dir=target)


def digest(root: Path) -> dict[str, str]:
    """SHA-256 over every (key, value) of every column family of the rebuilt stores."""
    out = {}
    for family in COLUMN_FAMILIES:
        h = hashlib.sha256()
        for partition in range(PARTITIONS):
            store = PartitionStore(root / f"p{partition:04d}", read_only=True)
            try:
                for key, value in store.items(family):
                    h.update(len(key).to_bytes(4, "big") + key)
                    h.update(len(value).to_bytes(4, "big") + value)
            finally:
                store.close()
        out[family] = h.hexdigest()
    return out


def open_log(path: Path, topology: Topology) -> tuple[EmbeddedTransport, int]:
    """The embedded log at ``path`` with the declared topics, and how many facts it holds."""
    transport = EmbeddedTransport(path, default_partitions=PARTITIONS)
    admin = transport.admin()
    admin.create_topics(topology.specs())
    admin.close()
    reader = transport.reader()
    topic = topology.name(TopicName.FACTS)
    have = sum(reader.end_offset(TopicPartition(topic, p)) for p in range(PARTITIONS))
    reader.close()
    return transport, have


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--facts", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=0, help="alternative to --facts: run count")
    parser.add_argument("--concurrency", type=int, default=500, help="runs interleaved per wave")
    parser.add_argument("--data-dir", type=Path, help="keep/reuse the log here (default: temp)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--profile", type=Path, help="cProfile stats of one extra replay")
    parser.add_argument("--digest", action="store_true", help="hash every rebuilt column family")
    parser.add_argument("--json", action="store_true", help="only the one-line JSON summary")
    args = parser.parse_args()
    say = (lambda *_: None) if args.json else print
    command = "PYTHONPATH=. python " + " ".join(sys.argv)
    say(f"$ {command}")
    scratch = args.data_dir is None
    root = Path(tempfile.mkdtemp(prefix="bench-replay-")) if scratch else args.data_dir
    try:
        topology = Topology(partitions=PARTITIONS)
        topic = topology.name(TopicName.FACTS)
        wanted = args.facts if not args.runs else int(args.runs * 7.65)
        transport, have = open_log(root / "log", topology)
        if 0 < have < wanted:  # run ids restart at 0: never append to a smaller log
            shutil.rmtree(root / "log")
            transport, have = open_log(root / "log", topology)
        build_seconds = 0.0
        if have < wanted:
            started = time.perf_counter()
            have += build_facts(transport, topic, wanted - have, args.concurrency)
            build_seconds = time.perf_counter() - started
            say(f"built {have:,} facts in {build_seconds:.1f}s")
        else:
            say(f"reusing {have:,} facts in {root / 'log'}")
        reads, replays = [], []
        report = None
        for _ in range(args.repeat):
            count, size, seconds = raw_read(transport, topic)
            reads.append(count / seconds)
            say(f"(a) raw read : {count:,} records, {size / 1e6:.0f} MB in {seconds:.2f}s")
            report = replay_once(transport, topology, root / "replayed" if args.digest else None)
            replays.append(report.facts / report.seconds)
            say(f"(b) replay   : {report.facts:,} facts, {report.runs:,} runs in {report.seconds:.2f}s")
        assert report is not None
        if args.profile:
            profiler = cProfile.Profile()
            profiler.enable()
            replay_once(transport, topology, None)
            profiler.disable()
            profiler.dump_stats(args.profile)
            say(f"profile written to {args.profile}")
        hashes = digest(root / "replayed") if args.digest else None
        read_rate, replay_rate = statistics.median(reads), statistics.median(replays)
        summary = {
            "bench": "replay_embedded",
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "cpus": len(__import__("os").sched_getaffinity(0)),
            "facts": have,
            "runs": report.runs,
            "facts_per_run": round(report.facts / report.runs, 2) if report.runs else None,
            "build_seconds": round(build_seconds, 1),
            "repeat": args.repeat,
            "raw_read_facts_per_s": round(read_rate),
            "replay_facts_per_s": round(replay_rate),
            "ratio_replay_to_raw_read": round(replay_rate / read_rate, 3),
            "target_ratio": 0.5,
            "raw_read_runs": [round(r) for r in reads],
            "replay_runs": [round(r) for r in replays],
            "digest": hashes,
            "command": command,
        }
        say(
            f"raw read {read_rate:,.0f} facts/s, replay {replay_rate:,.0f} facts/s, "
            f"ratio {replay_rate / read_rate:.3f} (target >= 0.5)"
        )
        print(json.dumps(summary))
    finally:
        if scratch:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
