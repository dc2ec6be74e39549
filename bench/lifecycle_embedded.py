"""Run lifecycle on the embedded log: N runs of the bundled order pipeline, end to end.

Run: ``PYTHONPATH=. python bench/lifecycle_embedded.py [--runs 5000] [--workers 2] [--json]``

Engine: a ``processor.host.Host`` (processor loop + ``--workers`` in-process worker
threads, like ``processor demo``) runs ``processor.examples.demo:app``. All runs are
submitted at once through ``processor.client.Client`` (a full backlog, as in the
demo), then every ``RunOutcome`` is collected from ``runs.results``. Reports runs/s
(first submit to last outcome), p50/p99 submit-to-result latency
(``finished_ms - submitted_ms``: includes queueing behind the backlog) and facts per run.

Baseline, same process, same machine, just before: the raw embedded-log round trip.
N records of the size of a SubmitRun are produced through ``transport.producer()``
(flushed in transactions of 1,000, as the client does) and read back through
``transport.reader().read()``; records/s = N / (produce + read time). The engine's
runs/s is printed as a ratio of that.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from processor.client import Client, new_submit
from processor.examples.demo import app
from processor.facts.codec import codec, encode
from processor.facts.models import RunOutcome
from processor.facts.topics import TopicName
from processor.host import Deployment, Host
from processor.settings import Settings
from processor.transport.base import Outbound, Reader, TopicPartition, TopicSpec
from processor.transport.embedded import EmbeddedTransport

PARTITIONS = 4


def percentile(sorted_values: list[int], fraction: float) -> float:
    """Nearest-rank percentile of an already sorted list (same rule as processor.demo)."""
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, round(fraction * (len(sorted_values) - 1)))
    return float(sorted_values[index])


def raw_round_trip(root: Path, records: int) -> dict[str, float]:
    """Produce ``records`` SubmitRun-sized records and read them back: the log's own cost."""
    transport = EmbeddedTransport(root / "baseline-log", default_partitions=PARTITIONS)
    admin = transport.admin()
    admin.create_topics([TopicSpec("bench.roundtrip", PARTITIONS)])
    admin.close()
    sample = encode(new_submit("orders", {"order_id": "order-000000", "amount": 42}))
    producer = transport.producer()
    started = time.perf_counter()
    for index in range(records):
        key = f"run-{index:08d}".encode()
        producer.produce(Outbound("bench.roundtrip", key, sample))
    producer.flush()
    produced = time.perf_counter() - started
    producer.close()
    reader = transport.reader()
    started = time.perf_counter()
    count = 0
    for partition in range(PARTITIONS):
        for batch in reader.read(TopicPartition("bench.roundtrip", partition), 0):
            for record in batch:
                count += len(record.value or b"") > 0
    read = time.perf_counter() - started
    reader.close()
    assert count == records, (count, records)
    return {
        "records": records,
        "value_bytes": len(sample),
        "produce_s": produced,
        "read_s": read,
        "round_trips_per_s": records / (produced + read),
    }


def collect(
    reader: Reader, positions: dict[TopicPartition, int], expected: int, timeout_s: float
) -> list[RunOutcome]:
    """Read RunOutcomes from runs.results until ``expected`` distinct runs have one."""
    outcomes: dict[str, RunOutcome] = {}
    deadline = time.monotonic() + timeout_s
    while len(outcomes) < expected:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(outcomes)} of {expected} runs finished in {timeout_s}s")
        progressed = False
        for tp, start in positions.items():
            for batch in reader.read(tp, start):
                for record in batch:
                    outcome = codec().decode_as(record.value, RunOutcome)
                    outcomes[outcome.run_id] = outcome
                    positions[tp] = record.offset + 1
                    progressed = True
        if not progressed:
            time.sleep(0.01)  # polling the results topic
    return list(outcomes.values())


def engine(root: Path, runs: int, workers: int, timeout_s: float) -> dict[str, Any]:
    """Submit ``runs`` orders to a Host with in-process workers; collect every outcome."""
    settings = Settings(data_dir=root / "engine", group=f"bench-{uuid.uuid4().hex[:8]}")
    deployment = Deployment.from_settings(settings)
    host = Host(deployment, app, workers=workers)
    topology = deployment.topology
    host.start()
    try:
        client = Client(deployment.transport, topology, settings.state_dir)
        reader = deployment.transport.reader()
        results = topology.name(TopicName.OUTCOMES)
        positions = {
            tp: reader.end_offset(tp)
            for tp in (TopicPartition(results, p) for p in range(topology.partitions))
        }
        started = time.perf_counter()
        for index in range(runs):
            order = {"order_id": f"order-{index:06d}", "amount": 10 + index % 90}
            client.send(new_submit("orders", order))
        client.flush()
        submitted_s = time.perf_counter() - started
        outcomes = collect(reader, positions, runs, timeout_s)
        seconds = time.perf_counter() - started
        client.close()
        facts_topic = topology.name(TopicName.FACTS)
        facts = sum(
            reader.end_offset(TopicPartition(facts_topic, p)) for p in range(topology.partitions)
        )
        reader.close()
    finally:
        host.stop()
    if host.errors:
        raise host.errors[0]
    latencies = sorted(o.finished_ms - o.submitted_ms for o in outcomes)
    return {
        "runs": runs,
        "succeeded": sum(o.status == "succeeded" for o in outcomes),
        "failed": sum(o.status == "failed" for o in outcomes),
        "seconds": seconds,
        "submit_seconds": submitted_s,
        "runs_per_s": runs / seconds,
        "p50_ms": percentile(latencies, 0.50),
        "p99_ms": percentile(latencies, 0.99),
        "facts": facts,
        "facts_per_run": facts / runs,
        "committed_batches": host.loop.committed_batches if host.loop else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--baseline-records", type=int, default=0, help="default: --runs")
    parser.add_argument("--data-dir", type=Path, help="keep the logs here (default: temp)")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--json", action="store_true", help="only the one-line JSON summary")
    args = parser.parse_args()
    say = (lambda *_: None) if args.json else print
    command = "PYTHONPATH=. python " + " ".join(sys.argv)
    say(f"$ {command}")
    scratch = args.data_dir is None
    root = Path(tempfile.mkdtemp(prefix="bench-lifecycle-")) if scratch else args.data_dir
    if not scratch and root.exists():
        shutil.rmtree(root)
    try:
        base = raw_round_trip(root, args.baseline_records or args.runs)
        say(
            f"baseline: {base['records']:,} x {base['value_bytes']} B records produced in "
            f"{base['produce_s']:.2f}s, read back in {base['read_s']:.2f}s: "
            f"{base['round_trips_per_s']:,.0f} round trips/s"
        )
        result = engine(root, args.runs, args.workers, args.timeout)
        say(
            f"engine: {result['runs']:,} runs ({result['succeeded']} ok, {result['failed']} "
            f"failed) in {result['seconds']:.2f}s = {result['runs_per_s']:,.0f} runs/s; "
            f"p50 {result['p50_ms']:.0f} ms, p99 {result['p99_ms']:.0f} ms; "
            f"{result['facts_per_run']:.2f} facts/run"
        )
    finally:
        if scratch:
            shutil.rmtree(root, ignore_errors=True)
    ratio = result["runs_per_s"] / base["round_trips_per_s"]
    say(f"engine runs/s / raw log round trips/s = {ratio:.4f} (1 run ~ {1 / ratio:.0f} round trips)")
    summary = {
        "bench": "lifecycle_embedded",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": len(os.sched_getaffinity(0)),
        "workers": args.workers,
        **{k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()},
        "baseline_round_trips_per_s": round(base["round_trips_per_s"]),
        "baseline_produce_per_s": round(base["records"] / base["produce_s"]),
        "baseline_read_per_s": round(base["records"] / base["read_s"]),
        "ratio_runs_to_round_trips": round(ratio, 5),
        "command": command,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
