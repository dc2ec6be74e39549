"""Admission on Kafka: completions/s and completion-to-continuation latency, against a raw trip.

Run: ``PYTHONPATH=. python bench/kafka_admission.py --bootstrap 127.0.0.1:9092
[--runs 3000] [--paced 1000] [--paced-fraction 0.5] [--baseline-records 50000] [--json]``

Setup: the processor (``python -m processor --broker kafka://... run --app
processor.examples.demo:app --workers 0``) and one worker process run the bundled
``orders`` pipeline, with NO responder: ``--runs + --paced`` runs are submitted and
each suspends at ``capture_payment`` (its BoundaryRequest, with the resume token,
is read from boundary.requests). Then the worker is stopped, so the processor does
nothing but admission (its warm-up, during which every pipeline version counts as
loaded, outlasts the run: the continuations are dispatched, not blocked for want of
a worker), and this process:

1. burst: produces ``--runs`` completions at once (``processor.clients.external.CompletionClient``,
   the payload ``processor.examples.demo.payments_simulator`` answers, flushed once);
2. paced: produces ``--paced`` more at ``--paced-fraction`` of the burst rate (open
   loop).

A consumer of segments.work (read_committed, started at its end) records when the
continuation's WorkItem (segment 1, first step ``invoice``) of each run becomes
visible. Per completion: latency = WorkItem visible - completion produced (wall
clock of this process, at the ``produce`` call); also ``stamped``: the WorkItem's
CreateTime (the processor's produce call, inside its transaction) - completion
produced. completions/s = completions / (first produced -> last continuation visible).

Baselines, same run, same broker: a raw produce -> consume round trip, a plain
idempotent producer (a client's, like CompletionClient's) producing records of a
completion's size to a 4-partition topic, consumed read_committed; records/s and
CreateTime-to-consumed latency. Before the engine, a burst of ``--baseline-records``
(produced at once, flushed once: the rate, and latency under a burst); after it,
``--paced`` records at the paced phase's offered rate (latency at that load).
Admission is one such trip in (the completion) plus one processor transaction
(facts, WorkItem, offsets) and its visibility.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _support import command_line, percentile
from confluent_kafka import TopicPartition as KafkaTopicPartition
from kafka_support import (
    broker_pid,
    committed_consumer,
    describe_baseline,
    engine,
    raw_round_trip,
    summary_head,
    temporary_topics,
    unique_prefix,
)

from processor.clients.external import CompletionClient
from processor.examples.demo import payments_simulator
from processor.facts import payload
from processor.facts.codec import codec
from processor.facts.models import BoundaryRequest, WorkItem
from processor.facts.topics import TopicName

_AN_HOUR_MS = 3_600_000


class Watch:
    """Consumes a topic of the deployment from a start position on a thread."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, start: int | None) -> None:
        self.consumer = committed_consumer(bootstrap)
        positions = []
        for partition in range(partitions):
            tp = KafkaTopicPartition(topic, partition)
            offset = 0 if start == 0 else self.consumer.get_watermark_offsets(tp, timeout=10)[1]
            positions.append(KafkaTopicPartition(topic, partition, offset))
        self.consumer.assign(positions)
        self.seen: dict[str, tuple[Any, float, int]] = {}  # run id -> (value, seen ms, stamp)
        self.lock = threading.Condition()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def decode(self, value: bytes) -> tuple[str, Any] | None:
        raise NotImplementedError

    def run(self) -> None:
        while not self.stop.is_set():
            messages = self.consumer.consume(1000, 0.02)
            now = time.time() * 1000
            found = []
            for msg in messages:
                if msg.error() is None and (decoded := self.decode(msg.value())) is not None:
                    found.append((decoded, msg.timestamp()[1]))
            if found:
                with self.lock:
                    for (run_id, value), stamp in found:
                        self.seen.setdefault(run_id, (value, now, stamp))
                    self.lock.notify_all()
        self.consumer.close()

    def wait(self, run_ids: set[str], timeout_s: float, alive: Any) -> None:
        deadline = time.monotonic() + timeout_s
        with self.lock:
            while not run_ids <= self.seen.keys():
                if time.monotonic() > deadline:
                    have = len(run_ids & self.seen.keys())
                    raise TimeoutError(f"{have} of {len(run_ids)} seen in {timeout_s}s")
                self.lock.wait(0.5)
                alive()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


class Requests(Watch):
    def decode(self, value: bytes) -> tuple[str, Any] | None:
        request = codec().decode_as(value, BoundaryRequest)
        return request.run_id, request


class Continuations(Watch):
    def decode(self, value: bytes) -> tuple[str, Any] | None:
        item = codec().decode_as(value, WorkItem)
        return (item.run_id, item) if item.segment >= 1 else None


def complete(
    client: CompletionClient,
    requests: list[BoundaryRequest],
    rate: float | None,
) -> dict[str, float]:
    """Produce a completion for each request (at ``rate`` per second, or at once)."""
    produced: dict[str, float] = {}
    started = time.perf_counter()
    for index, request in enumerate(requests):
        if rate is not None:
            delay = started + index / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)  # pacing the offered load
        body = payload.dumps(payments_simulator(request, payload.loads(request.request)))
        produced[request.run_id] = time.time() * 1000
        client.send(request.resume_token, "success", body, None, flush=False)
    client.flush()
    return produced


def measure(
    continuations: Continuations, produced: dict[str, float], timeout_s: float, alive: Any
) -> dict[str, Any]:
    continuations.wait(set(produced), timeout_s, alive)
    seen = {run_id: continuations.seen[run_id] for run_id in produced}
    latencies = sorted(seen[r][1] - produced[r] for r in produced)
    stamped = sorted(seen[r][2] - produced[r] for r in produced)
    first = min(produced.values())
    last = max(at for _, at, _ in seen.values())
    return {
        "completions": len(produced),
        "seconds": round((last - first) / 1000, 3),
        "completions_per_s": len(produced) / ((last - first) / 1000),
        "p50_ms": percentile(latencies, 0.50),
        "p95_ms": percentile(latencies, 0.95),
        "p99_ms": percentile(latencies, 0.99),
        "stamped_p50_ms": percentile(stamped, 0.50),
        "stamped_p99_ms": percentile(stamped, 0.99),
    }


def run_admission(
    args: argparse.Namespace, prefix: str, root: Path, say: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Suspend the runs, stop the worker, then complete them: (burst, paced) figures."""
    # The worker stops once the runs wait: a processor that heard it leave would hold
    # every continuation until a worker loads the pipeline again (definition_blocked),
    # and this measures admission, not that. A warm-up longer than the run, during
    # which every version counts as loaded, keeps the continuations flowing.
    with engine(
        args.bootstrap, prefix, root, responder="none", announce_interval_ms=_AN_HOUR_MS
    ) as running:
        topology = running.deployment.topology
        requests = Requests(
            args.bootstrap, topology.name(TopicName.REQUESTS), topology.partitions, 0
        )
        requests.thread.start()
        submitted = running.submit(args.runs + args.paced)
        started = time.perf_counter()
        requests.wait(set(submitted), args.timeout, running.fleet.check)
        requests.close()
        say(f"setup: {len(submitted):,} runs suspended in {time.perf_counter() - started:.1f}s")
        running.fleet.stop("worker0")  # the processor now only admits
        continuations = Continuations(
            args.bootstrap, topology.name(TopicName.WORK), topology.partitions, None
        )
        continuations.thread.start()
        time.sleep(1.0)  # the watcher's first fetch; no event says it is positioned
        pending = [requests.seen[run_id][0] for run_id in submitted]
        client = CompletionClient(running.deployment.transport, topology)
        cpu = running.fleet.cpu()["processor"]
        burst_done = complete(client, pending[: args.runs], None)
        burst = measure(continuations, burst_done, args.timeout, running.fleet.check)
        spent = running.fleet.cpu()["processor"] - cpu
        burst["processor_cpu_ms_per_completion"] = round(1000 * spent / args.runs, 3)
        say(describe("burst", burst))
        rate = burst["completions_per_s"] * args.paced_fraction
        paced_done = complete(client, pending[args.runs :], rate)
        paced = measure(continuations, paced_done, args.timeout, running.fleet.check)
        paced["offered_rate"] = round(rate, 1)
        say(describe("paced", paced))
        client.close()
        continuations.close()
    return burst, paced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--runs", type=int, default=3_000, help="completions in the burst")
    parser.add_argument("--paced", type=int, default=1_000, help="completions in the paced phase")
    parser.add_argument("--paced-fraction", type=float, default=0.5)
    parser.add_argument("--baseline-records", type=int, default=50_000)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--json", action="store_true", help="only the one-line JSON summary")
    args = parser.parse_args()
    say = (lambda *_: None) if args.json else functools.partial(print, flush=True)
    command = command_line(sys.argv)
    say(f"$ {command}")
    broker = broker_pid()  # a shared broker: notice if it restarts mid-run
    prefix = unique_prefix("admission")
    root = Path(tempfile.mkdtemp(prefix="bench-kafka-admission-"))
    try:
        with temporary_topics(args.bootstrap, prefix):
            sample = 400  # bytes: about a BoundaryCompletion with its token
            base = raw_round_trip(
                args.bootstrap,
                f"{prefix}baseline",
                args.baseline_records,
                value_size=sample,
                transactional=False,
            )
            say(f"baseline: {describe_baseline(base)}")
            burst, paced = run_admission(args, prefix, root, say)
            slow = raw_round_trip(
                args.bootstrap,
                f"{prefix}baseline-paced",
                args.paced,
                value_size=sample,
                transactional=False,
                rate=paced["offered_rate"],
            )
            say(f"baseline (paced): {describe_baseline(slow)}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ratios = {
        "burst_rate_to_raw": round(burst["completions_per_s"] / base["records_per_s"], 4),
        "burst_p50_to_raw_burst": round(burst["p50_ms"] / base["p50_ms"], 2),
        "burst_p99_to_raw_burst": round(burst["p99_ms"] / base["p99_ms"], 2),
        "paced_p50_to_raw_paced": round(paced["p50_ms"] / slow["p50_ms"], 2),
        "paced_p99_to_raw_paced": round(paced["p99_ms"] / slow["p99_ms"], 2),
    }
    say(f"ratios to the raw round trip: {ratios}")
    summary = {
        **summary_head("kafka_admission", broker, say),
        "burst": {k: round(v, 2) if isinstance(v, float) else v for k, v in burst.items()},
        "paced": {k: round(v, 2) if isinstance(v, float) else v for k, v in paced.items()},
        "baseline": {k: round(base[k], 2) for k in ("records_per_s", "p50_ms", "p95_ms", "p99_ms")},
        "ratios": ratios,
        "command": command,
    }
    print(json.dumps(summary))


def describe(name: str, result: dict[str, Any]) -> str:
    offered = f" offered {result['offered_rate']:,.0f}/s," if "offered_rate" in result else ""
    return (
        f"{name}:{offered} {result['completions']:,} completions in {result['seconds']:.2f}s = "
        f"{result['completions_per_s']:,.0f}/s; completion -> continuation visible p50 "
        f"{result['p50_ms']:.0f} ms, p99 {result['p99_ms']:.0f} ms (stamped p50 "
        f"{result['stamped_p50_ms']:.0f} ms)"
    )


if __name__ == "__main__":
    main()
