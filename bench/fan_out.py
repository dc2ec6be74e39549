"""A fan-out of 10,000 items of a no-op function on the embedded log: items per second,
and the processor's memory.

Run: ``PYTHONPATH=. python bench/fan_out.py [--items 10000] [--max-in-flight 64]
[--repeat 3] [--json]``

Engine: what ``processor run`` runs with the default worker settings (a
``processor.engine.host.Host``: the processor loop in this process, 2 workers at the
default ``worker_concurrency`` in their child process), with this script's ``app``: a
graph of two steps, ``make`` (returns the list of ``--items`` integers) and
``touch``, a fan-out over that list whose function returns its item, at most
``--max-in-flight`` items at once. Each round submits one run and waits for it; a
round's figure is ``items / (finished_ms - submitted_ms)`` of its outcome. Memory is
this process's (the processor's) resident set, read from /proc before the first round
and its peak (``VmHWM``) after the last; the worker child's peak too.

Baseline, same run: a chain run of one no-op step (``one``), alternated with the
fan-out rounds: the fan-out's time per item against one run's time says what an item
costs against a whole run (each item is an attempt with its own work item, result and
facts, as a one-step run is).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _support import app_host, begin, cpus, proc_status, rounds_parser, timed_run

from processor.worker.pipeline import Application, Pipeline

MIB = 1024 * 1024


def build_app(items: int, max_in_flight: int) -> Application:
    """``fan``: a list of ``items``, then a fan-out of a no-op over it; ``one``: a no-op."""
    fan = Pipeline("fan")
    fan.step("make")(lambda value: list(range(items)))
    fan.fan_out("touch", needs=["make"], max_in_flight=max_in_flight)(lambda item: item)
    one = Pipeline("one")
    one.step("touch")(lambda value: value)
    return Application([fan, one])


# What the worker child loads (``fan_out:app``): sized through the environment.
app = build_app(
    int(os.environ.get("BENCH_FAN_OUT_ITEMS", "10000")),
    int(os.environ.get("BENCH_FAN_OUT_IN_FLIGHT", "64")),
)


def measure(root: Path, application: Application, repeat: int, timeout_s: float) -> dict[str, Any]:
    times: dict[str, list[float]] = {"one": [], "fan": []}
    with app_host(root, application, "fan_out:app") as (deployment, client):
        start_rss = proc_status(os.getpid())["VmRSS"]
        for _ in range(repeat):
            times["one"].append(timed_run(client, deployment, "one", timeout_s))
            times["fan"].append(timed_run(client, deployment, "fan", timeout_s))
        peak_rss = proc_status(os.getpid())["VmHWM"]
        child_peak = max((proc_status(pid)["VmHWM"] for pid in _children()), default=0)
    return {**times, "start_rss": start_rss, "peak_rss": peak_rss, "child_peak": child_peak}


def _children() -> list[int]:
    """This process's child processes (the worker child), from /proc."""
    found: list[int] = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        found += [int(pid) for pid in (task / "children").read_text().split()]
    return found


def main() -> None:
    parser = rounds_parser(__doc__, repeat=3, timeout_s=600.0, timed="a run")
    parser.add_argument("--items", type=int, default=10_000, help="items of the fan-out")
    parser.add_argument("--max-in-flight", type=int, default=64, help="items open at once")
    args = parser.parse_args()
    os.environ["BENCH_FAN_OUT_ITEMS"] = str(args.items)
    os.environ["BENCH_FAN_OUT_IN_FLIGHT"] = str(args.max_in_flight)
    command, say = begin(args)
    root = Path(tempfile.mkdtemp(prefix="bench-fan-out-"))
    try:
        found = measure(root, build_app(args.items, args.max_in_flight), args.repeat, args.timeout)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rates = [args.items / (ms / 1000) for ms in found["fan"]]
    rate = statistics.median(rates)
    one_ms = statistics.median(found["one"])
    per_item_ms = 1000 / rate
    for index, (single, fan) in enumerate(zip(found["one"], found["fan"], strict=True)):
        say(f"round {index + 1}: one run {single:.0f} ms, {args.items:,} items {fan:.0f} ms")
    say(
        f"median: {rate:,.0f} items/s ({per_item_ms:.2f} ms an item; a one-step run "
        f"{one_ms:.0f} ms); processor RSS {found['start_rss'] / MIB:.1f} MiB before, peak "
        f"{found['peak_rss'] / MIB:.1f} MiB ({cpus()} CPUs)"
    )
    summary = {
        "bench": "fan_out",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "items": args.items,
        "max_in_flight": args.max_in_flight,
        "rounds": args.repeat,
        "items_per_s": round(rate, 1),
        "items_per_s_rounds": [round(r, 1) for r in rates],
        "one_run_ms": round(one_ms, 1),
        "rss_start_mib": round(found["start_rss"] / MIB, 1),
        "rss_peak_mib": round(found["peak_rss"] / MIB, 1),
        "worker_child_peak_mib": round(found["child_peak"] / MIB, 1),
        "cpus": cpus(),
        "command": command,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
