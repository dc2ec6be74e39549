"""The standard workload with the Confluent wire format against single-object encoding.

Run: ``PYTHONPATH=. python bench/kafka_registry.py --bootstrap 127.0.0.1:9092
--registry http://127.0.0.1:8081/apis/ccompat/v7 [--runs 2000] [--rounds 2]
[--warmup 100] [--json]``

The deployment of bench/kafka_standard_workload.py (processor, one worker and the
payment responder, each its own process; the demo ``orders`` pipeline), started
twice per round on fresh topics: once with ``PROCESSOR_SCHEMA_REGISTRY_URL`` (every
record Confluent-framed, its schema registered, every read resolved through the
registry's cached ids) and once without. The two encodings alternate over
``--rounds`` rounds (the order flips each round) so that drift on the shared
machine hits both alike. Reported: saturation runs/s and p50/p99 of each, and the
ratio registry / single-object of the mean runs/s (target: at least 0.95).
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
    engine,
    measure_runs,
    summary_head,
    temporary_topics,
    unique_prefix,
)


def one_deployment(
    args: argparse.Namespace, registry: str | None, root: Path, say: Any
) -> dict[str, Any]:
    """Warm up and saturate one fresh deployment; its saturation result."""
    name = "registry" if registry else "single-object"
    prefix = unique_prefix(f"registry-{'on' if registry else 'off'}")
    with (
        temporary_topics(args.bootstrap, prefix),
        engine(args.bootstrap, prefix, root / prefix, registry=registry) as running,
    ):
        running.warm_up(args.warmup)
        result = measure_runs(running, args.runs, args.timeout)
    say(
        f"{name}: {result['runs']:,} runs ({result['succeeded']} ok) in {result['seconds']:.2f}s"
        f" = {result['runs_per_s']:,.1f} runs/s; p50 {result['p50_ms']:.0f} ms,"
        f" p99 {result['p99_ms']:.0f} ms"
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--registry", default="http://127.0.0.1:8081/apis/ccompat/v7")
    parser.add_argument("--runs", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--json", action="store_true", help="only the one-line JSON summary")
    args = parser.parse_args()
    say = (lambda *_: None) if args.json else functools.partial(print, flush=True)
    command = command_line(sys.argv)
    say(f"$ {command}")
    broker = broker_pid()
    root = Path(tempfile.mkdtemp(prefix="bench-kafka-registry-"))
    results: dict[str, list[dict[str, Any]]] = {"registry": [], "single_object": []}
    try:
        for index in range(args.rounds):
            order = [args.registry, None] if index % 2 == 0 else [None, args.registry]
            for registry in order:
                key = "registry" if registry else "single_object"
                results[key].append(one_deployment(args, registry, root, say))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    mean = {key: statistics.mean(r["runs_per_s"] for r in runs) for key, runs in results.items()}
    ratio = round(mean["registry"] / mean["single_object"], 3)
    say(f"registry / single-object runs/s: {ratio} (target >= 0.95)")
    summary = {
        **summary_head("kafka_registry", broker, say),
        "runs": {key: sum(r["runs"] for r in runs) for key, runs in results.items()},
        "succeeded": {key: sum(r["succeeded"] for r in runs) for key, runs in results.items()},
        "runs_per_s": {key: round(value, 1) for key, value in mean.items()},
        "p50_ms": {k: statistics.mean(r["p50_ms"] for r in v) for k, v in results.items()},
        "p99_ms": {k: statistics.mean(r["p99_ms"] for r in v) for k, v in results.items()},
        "registry_to_single_object": ratio,
        "command": command,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
