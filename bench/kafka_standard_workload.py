"""The standard workload on Kafka: 3 steps, one scalar await answered by another process, 1 step.

Run: ``PYTHONPATH=. python bench/kafka_standard_workload.py --bootstrap 127.0.0.1:9092
[--runs 3000] [--paced-runs 1500] [--paced-fraction 0.5] [--warmup 100] [--json]``

The workload is the bundled ``processor.examples.demo:app`` ``orders`` pipeline:
validate -> reserve_stock (fails once for one order in five: a retry after 20 ms)
-> capture_payment (await, target ``payments``) -> invoice. Deployment, each in its
own process (bench/kafka_support.py ``engine``): the processor (``python -m processor
--broker kafka://... run --app processor.examples.demo:app --workers 0``), one worker
(``python -m processor ... worker --app ...``) and the external payment system
(bench/kafka_responder.py: ``processor.clients.external.Responder`` with
``processor.examples.demo.payments_simulator``). This process submits through
``processor.clients.client.Client`` and reads outcomes on runs.results.

Two phases after ``--warmup`` runs:

1. saturation: ``--runs`` runs submitted at once; runs/s = runs / (first submit ->
   last outcome visible);
2. paced: ``--paced-runs`` runs submitted at a steady ``--paced-fraction`` of the
   saturation rate (open loop), so latency is not queueing behind a backlog.

Latency per run: p50/p95/p99 of ``finished_ms - submitted_ms`` of its RunOutcome.
Baseline, same run, before and after the engine (mean used): a raw produce ->
consume round trip through one 4-partition topic (transactional producer with the
processor's config committing every 500 records, read_committed consumer).
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from _support import command_line
from kafka_support import (
    broker_pid,
    describe_baseline,
    engine,
    measure_runs,
    raw_round_trip,
    summary_head,
    temporary_topics,
    unique_prefix,
)


def describe(name: str, result: dict[str, Any]) -> str:
    offered = f" offered {result['offered_rate']:,.0f}/s," if result["offered_rate"] else ""
    return (
        f"{name}:{offered} {result['runs']:,} runs ({result['succeeded']} ok) in "
        f"{result['seconds']:.2f}s = {result['runs_per_s']:,.1f} runs/s; p50 "
        f"{result['p50_ms']:.0f} ms, p95 {result['p95_ms']:.0f} ms, p99 {result['p99_ms']:.0f} ms"
    )


def rounded(result: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--runs", type=int, default=3_000)
    parser.add_argument("--paced-runs", type=int, default=1_500)
    parser.add_argument("--paced-fraction", type=float, default=0.5)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--baseline-records", type=int, default=50_000)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--json", action="store_true", help="only the one-line JSON summary")
    args = parser.parse_args()
    say = (lambda *_: None) if args.json else functools.partial(print, flush=True)
    command = command_line(sys.argv)
    say(f"$ {command}")
    broker = broker_pid()  # a shared broker: notice if it restarts mid-run
    prefix = unique_prefix("standard")
    root = Path(tempfile.mkdtemp(prefix="bench-kafka-standard-"))
    try:
        with temporary_topics(args.bootstrap, prefix):
            records = args.baseline_records
            before = raw_round_trip(args.bootstrap, f"{prefix}baseline-before", records)
            say(f"baseline before: {describe_baseline(before)}")
            with engine(args.bootstrap, prefix, root) as running:
                warm = running.warm_up(args.warmup)
                say(f"warm-up: {args.warmup} runs in {warm:.1f}s")
                saturated = measure_runs(running, args.runs, args.timeout)
                say(describe("saturation", saturated))
                rate = saturated["runs_per_s"] * args.paced_fraction
                paced = measure_runs(running, args.paced_runs, args.timeout, rate=rate)
                say(describe("paced", paced))
            after = raw_round_trip(args.bootstrap, f"{prefix}baseline-after", records)
            say(f"baseline after:  {describe_baseline(after)}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    raw = {
        key: statistics.mean([before[key], after[key]])
        for key in ("records_per_s", "p50_ms", "p95_ms", "p99_ms")
    }
    ratios = {
        "saturation_runs_to_raw_records": round(saturated["runs_per_s"] / raw["records_per_s"], 5),
        **{
            f"{phase}_{q}_to_raw": round(result[f"{q}_ms"] / raw[f"{q}_ms"], 2)
            for phase, result in (("saturation", saturated), ("paced", paced))
            for q in ("p50", "p95", "p99")
        },
    }
    say(f"CPU ms per run (saturation): {saturated['cpu_ms_per_run']}")
    say(f"ratios to the raw round trip: {ratios}")
    summary = {
        **summary_head("kafka_standard_workload", broker, say),
        "saturation": rounded(saturated),
        "paced": rounded(paced),
        "baseline": {k: round(v, 2) for k, v in raw.items()},
        "baseline_samples_per_s": [round(before["records_per_s"]), round(after["records_per_s"])],
        "ratios": ratios,
        "command": command,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
