"""Run lifecycle on the embedded log: N runs of the bundled order pipeline, end to end.

Run: ``PYTHONPATH=. python bench/lifecycle_embedded.py [--runs 5000] [--workers 2] [--json]``

Engine: what ``processor demo`` runs (see bench/_support.py): a ``processor.engine.host.Host``
(processor loop + ``--workers`` in-process workers, in a child process as in
``processor demo``; the bench waits for them to be ready before it submits) with
``processor.examples.demo:app`` and the demo's payment simulator answering the
await step. All runs are submitted at once through ``processor.clients.client.Client`` (a
full backlog, as in the demo), then every ``RunOutcome`` is collected from
``runs.results``. Reports runs/s (first submit to last outcome), p50/p99
submit-to-result latency (``finished_ms - submitted_ms``, which includes queueing
behind the backlog) and facts per run.

Baseline, same process, just before: the raw embedded-log round trip. N records of
the size of a SubmitRun are produced through ``transport.producer()`` (transactions
of 1,000 records, as the client flushes) and read back through
``transport.reader().read()``; round trips/s = N / (produce + read time). The
engine's runs/s is printed as a ratio of that.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _support import Outcomes, command_line, cpus, engine, facts_in_log, percentile, submit

from processor.clients.client import Client, new_submit
from processor.facts.codec import encode
from processor.transport.base import Outbound, TopicPartition, TopicSpec
from processor.transport.embedded import EmbeddedTransport

PARTITIONS = 4


def raw_round_trip(root: Path, records: int) -> dict[str, float]:
    """Produce ``records`` SubmitRun-sized records and read them back: the log's own cost."""
    transport = EmbeddedTransport(root / "baseline-log", default_partitions=PARTITIONS)
    admin = transport.admin()
    admin.create_topics([TopicSpec("bench.roundtrip", PARTITIONS)])
    admin.close()
    sample = encode(new_submit("orders", {"order_id": "order-0000000", "amount": 42}))
    producer = transport.producer()
    started = time.perf_counter()
    for index in range(records):
        producer.produce(Outbound("bench.roundtrip", f"run-{index:08d}".encode(), sample))
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


def run_engine(root: Path, runs: int, workers: int, timeout_s: float) -> dict[str, Any]:
    """Submit ``runs`` orders to the demo engine at once; collect every outcome."""
    with engine(root / "engine", workers) as running:
        deployment = running.deployment
        outcomes = Outcomes(deployment)
        client = Client(deployment.transport, deployment.topology, running.settings.state_dir)
        started = time.perf_counter()
        submit(client, 0, runs)
        submitted_s = time.perf_counter() - started
        collected = outcomes.collect(runs, timeout_s)
        seconds = time.perf_counter() - started
        client.close()
        outcomes.close()
        facts = facts_in_log(deployment)
        batches = running.host.loop.committed_batches if running.host.loop else None
    latencies = sorted(o.finished_ms - o.submitted_ms for o in collected)
    return {
        "runs": runs,
        "succeeded": sum(o.status == "succeeded" for o in collected),
        "failed": sum(o.status == "failed" for o in collected),
        "seconds": seconds,
        "submit_seconds": submitted_s,
        "runs_per_s": runs / seconds,
        "p50_ms": percentile(latencies, 0.50),
        "p99_ms": percentile(latencies, 0.99),
        "facts": facts,
        "facts_per_run": facts / runs,
        "committed_batches": batches,
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
    say = (lambda *_: None) if args.json else functools.partial(print, flush=True)
    command = command_line(sys.argv)
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
        result = run_engine(root, args.runs, args.workers, args.timeout)
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
    say(f"engine runs/s / raw round trips/s = {ratio:.4f} (one run costs ~{1 / ratio:.0f})")
    summary = {
        "bench": "lifecycle_embedded",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": cpus(),
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
