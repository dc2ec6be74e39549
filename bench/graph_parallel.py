"""Parallel graph steps on the embedded log: ten independent 200 ms async steps in one
run against a run of one such step.

Run: ``PYTHONPATH=. python bench/graph_parallel.py [--steps 10] [--step-ms 200]
[--repeat 5] [--json]``

Engine: what ``processor run`` runs with the default worker settings (a
``processor.engine.host.Host``: the processor loop and 2 in-process workers at the
default ``worker_concurrency``, in their child process), with this script's ``app``:
``one`` is a single step that awaits ``--step-ms`` (the stand-in for a network call);
``wide`` is a graph of ``--steps`` such steps that need nothing, so all of them are
dispatched by the submit's commit, each in its own lane. The bench waits for the
workers to be ready, runs one warm-up run of each, then alternates ``--repeat`` rounds:
a ``one`` run, then a ``wide`` run, one at a time. A run's time is its outcome's
``finished_ms - submitted_ms`` (submit to terminal, both stamped by the client and
the processor on this machine). The figure is the median ``wide`` time over the
median ``one`` time; issue 28's target is under 3x.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _support import app_host, begin, cpus, rounds_parser, timed_run

from processor.worker.pipeline import Application, Pipeline


def build_app(steps: int, step_ms: int) -> Application:
    """``one``: a step awaiting ``step_ms``; ``wide``: ``steps`` of them, needing nothing."""

    async def call(value: Any) -> Any:
        await asyncio.sleep(step_ms / 1000)  # a downstream call's latency
        return value

    single = Pipeline("one")
    single.step("call", timeout_s=60)(call)
    parallel = Pipeline("wide")
    for index in range(steps):
        parallel.step(f"call_{index}", needs=[], timeout_s=60)(call)
    return Application([single, parallel])


# What the worker child loads (``graph_parallel:app``): sized by main() through the
# environment, which the child inherits.
app = build_app(
    int(os.environ.get("BENCH_GRAPH_STEPS", "10")),
    int(os.environ.get("BENCH_GRAPH_STEP_MS", "200")),
)


def measure(
    root: Path, application: Application, repeat: int, timeout_s: float
) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"one": [], "wide": []}
    with app_host(root, application, "graph_parallel:app") as (deployment, client):
        for round_ in range(repeat + 1):  # round 0: a warm-up of each
            for pipeline in ("one", "wide"):
                ms = timed_run(client, deployment, pipeline, timeout_s)
                if round_:
                    times[pipeline].append(ms)
    return times


def main() -> None:
    parser = rounds_parser(__doc__, repeat=5, timeout_s=120.0, timed="a run")
    parser.add_argument("--steps", type=int, default=10, help="independent steps of a wide run")
    parser.add_argument("--step-ms", type=int, default=200, help="what each step awaits")
    args = parser.parse_args()
    # The worker child imports this module by name: the sizes go with it in its
    # environment, and this directory on its path.
    os.environ["BENCH_GRAPH_STEPS"] = str(args.steps)
    os.environ["BENCH_GRAPH_STEP_MS"] = str(args.step_ms)
    command, say = begin(args)
    root = Path(tempfile.mkdtemp(prefix="bench-graph-parallel-"))
    try:
        times = measure(root, build_app(args.steps, args.step_ms), args.repeat, args.timeout)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    one_ms = statistics.median(times["one"])
    wide_ms = statistics.median(times["wide"])
    ratio = wide_ms / one_ms
    for index, (single, parallel) in enumerate(zip(times["one"], times["wide"], strict=True)):
        say(f"round {index + 1}: one step {single:.0f} ms, {args.steps} steps {parallel:.0f} ms")
    say(
        f"median: one step {one_ms:.0f} ms, {args.steps} independent steps {wide_ms:.0f} ms:"
        f" {ratio:.2f}x one step's time (target < 3x; {cpus()} CPUs)"
    )
    summary = {
        "bench": "graph_parallel",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "steps": args.steps,
        "step_ms": args.step_ms,
        "rounds": args.repeat,
        "one_ms": round(one_ms, 1),
        "wide_ms": round(wide_ms, 1),
        "ratio": round(ratio, 3),
        "one_ms_rounds": times["one"],
        "wide_ms_rounds": times["wide"],
        "cpus": cpus(),
        "command": command,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
