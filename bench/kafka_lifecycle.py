"""Run lifecycle on Kafka: runs/s and submit-to-result latency, against a raw round trip.

Run: ``PYTHONPATH=. python bench/kafka_lifecycle.py --bootstrap 127.0.0.1:9092
[--runs 3000] [--warmup 100] [--responder process|thread] [--baseline-records 50000] [--json]``

Engine (bench/kafka_support.py ``engine``), on a fresh topic prefix:

- the processor: ``python -m processor --broker kafka://... run --app
  processor.examples.demo:app --workers 0`` (its own process, no in-process workers);
- ONE worker process: ``python -m processor --broker kafka://... worker --app ...``;
- the demo's payment system answering the ``payments`` await: a
  ``processor.clients.external.Responder`` with ``processor.examples.demo.payments_simulator``,
  in a third process (bench/kafka_responder.py, default) or on a thread of this one.

The bundled ``orders`` pipeline: validate -> reserve_stock (fails once for one order
in five, retried after 20 ms) -> capture_payment (await) -> invoice. After
``--warmup`` runs (group joins, first fetches), ``--runs`` runs are submitted at once
(a full backlog) through ``processor.clients.client.Client``; runs/s = runs / (first submit
-> last RunOutcome visible on runs.results), latency = ``finished_ms - submitted_ms``
of each RunOutcome (includes queueing behind the backlog).

Baseline, same run, before and after the engine (the mean is used): a raw Kafka
produce -> consume round trip through one 4-partition topic, a transactional producer
with the processor's producer config committing every 500 records (the processor's
max batch), a read_committed consumer; records/s and CreateTime-to-consumed latency.
A run is many such trips (submit, work, result, request, completion, work, result,
outcome; ~20 facts), so the ratio says how many raw round trips one run costs.
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


def baseline(args: argparse.Namespace, prefix: str, tag: str) -> dict[str, Any]:
    return raw_round_trip(
        args.bootstrap, f"{prefix}baseline-{tag}", args.baseline_records, txn_batch=500
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--runs", type=int, default=3_000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--responder", choices=("process", "thread"), default="process")
    parser.add_argument("--baseline-records", type=int, default=50_000)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--keep", action="store_true", help="keep topics and the state dir")
    parser.add_argument("--json", action="store_true", help="only the one-line JSON summary")
    args = parser.parse_args()
    say = (lambda *_: None) if args.json else functools.partial(print, flush=True)
    command = command_line(sys.argv)
    say(f"$ {command}")
    broker = broker_pid()  # a shared broker: notice if it restarts mid-run
    prefix = unique_prefix("lifecycle")
    root = Path(tempfile.mkdtemp(prefix="bench-kafka-lifecycle-"))
    say(f"topic prefix {prefix}, state and logs in {root}")
    try:
        with temporary_topics(args.bootstrap, prefix, args.keep):
            before = baseline(args, prefix, "before")
            say(f"baseline before: {describe_baseline(before)}")
            with engine(args.bootstrap, prefix, root, responder=args.responder) as running:
                warm = running.warm_up(args.warmup)
                say(f"warm-up: {args.warmup} runs in {warm:.1f}s")
                result = measure_runs(running, args.runs, args.timeout)
            after = baseline(args, prefix, "after")
            say(f"baseline after:  {describe_baseline(after)}")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    raw_rate = statistics.mean([before["records_per_s"], after["records_per_s"]])
    raw_p50 = statistics.mean([before["p50_ms"], after["p50_ms"]])
    raw_p99 = statistics.mean([before["p99_ms"], after["p99_ms"]])
    ratio = result["runs_per_s"] / raw_rate
    say(
        f"engine: {result['runs']:,} runs ({result['succeeded']} ok, {result['failed']} not) "
        f"in {result['seconds']:.2f}s = {result['runs_per_s']:,.1f} runs/s; "
        f"p50 {result['p50_ms']:.0f} ms, p99 {result['p99_ms']:.0f} ms"
    )
    say(f"CPU ms per run: {result['cpu_ms_per_run']}")
    say(
        f"ratio runs/s : raw records/s = {ratio:.4f} (one run ~ {1 / ratio:.0f} raw round "
        f"trips); p50 {result['p50_ms'] / raw_p50:.1f}x, p99 {result['p99_ms'] / raw_p99:.1f}x "
        "the raw round trip's"
    )
    summary = {
        **summary_head("kafka_lifecycle", broker, say),
        "responder": args.responder,
        "workers": 1,
        **{k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()},
        "baseline_records_per_s": round(raw_rate),
        "baseline_p50_ms": round(raw_p50, 2),
        "baseline_p99_ms": round(raw_p99, 2),
        "baseline_samples_per_s": [round(before["records_per_s"]), round(after["records_per_s"])],
        "ratio_runs_to_raw_records": round(ratio, 5),
        "ratio_p50_to_raw": round(result["p50_ms"] / raw_p50, 2),
        "ratio_p99_to_raw": round(result["p99_ms"] / raw_p99, 2),
        "command": command,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
