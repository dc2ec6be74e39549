"""The standard workload with the HTTP server and metrics on, against off, alternated.

Run: ``PYTHONPATH=. python bench/http_overhead.py [--runs 3000] [--rounds 5] [--workers 2]
[--scrape-interval 1] [--json]``

Engine: the embedded-log lifecycle (bench/_support.py, as bench/lifecycle_embedded.py):
a ``Host`` with ``processor.examples.demo:app`` (3 steps, an await answered by the
demo's payment simulator, 1 step) and ``--workers`` worker threads; every run is
submitted at once, then every outcome collected. Each round runs the workload
twice on fresh logs, in alternating order:

- on: metrics recorded, ``ProcessorWeb`` (the server ``processor run`` starts)
  serving on a free port, and a scraper fetching ``/metrics`` every
  ``--scrape-interval`` seconds, as Prometheus would (its default is 15 s; 1 s is
  harsher);
- off: metrics not recorded (``--no-http``) and no server.

Reports runs/s of each side (median of the rounds) and the ratio on / off, both
of the medians and the median of each round's ratio, and the process's CPU seconds
a side (median; ``cpu_ratio`` on / off). Target (issue 19): at least
0.95, i.e. no more than 5 % slower.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from _support import Engine, Outcomes, command_line, cpus, engine, submit

from processor.clients.client import Client
from processor.telemetry.metrics import set_recording
from processor.web.wiring import ProcessorWeb


@contextmanager
def served(running: Engine, interval_s: float) -> Iterator[dict[str, int]]:
    """The processor's HTTP server, scraped every ``interval_s`` until the block ends."""
    web = ProcessorWeb(running.host, port=0)
    address = web.start()
    stop = threading.Event()
    scrapes = {"count": 0}

    def scrape() -> None:
        with httpx.Client(base_url=address, timeout=30) as http:
            while not stop.wait(interval_s):
                http.get("/metrics").raise_for_status()
                scrapes["count"] += 1

    scraper = threading.Thread(target=scrape, name="scraper", daemon=True)
    scraper.start()
    try:
        yield scrapes
    finally:
        stop.set()
        scraper.join(30)
        web.stop()


def one_side(root: Path, on: bool, args: argparse.Namespace) -> dict[str, Any]:
    """The workload once, with HTTP and metrics ``on`` or off."""
    set_recording(on)
    with engine(root, args.workers) as running:
        d = running.deployment
        outcomes = Outcomes(d)
        client = Client(d.transport, d.topology, running.settings.state_dir)
        with served(running, args.scrape_interval) if on else _nothing() as scrapes:
            started, cpu_started = time.perf_counter(), time.process_time()
            submit(client, 0, args.runs)
            collected = outcomes.collect(args.runs, args.timeout)
            seconds = time.perf_counter() - started
            cpu_s = time.process_time() - cpu_started  # every thread: loop, workers, server
        client.close()
        outcomes.close()
    return {
        "runs_per_s": args.runs / seconds,
        "cpu_s": cpu_s,
        "succeeded": sum(o.status == "succeeded" for o in collected),
        "scrapes": scrapes["count"],
    }


@contextmanager
def _nothing() -> Iterator[dict[str, int]]:
    yield {"count": 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--scrape-interval", type=float, default=1.0, help="seconds")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--json", action="store_true", help="only the one-line JSON summary")
    args = parser.parse_args()
    say = (lambda *_: None) if args.json else functools.partial(print, flush=True)
    command = command_line(sys.argv)
    say(f"$ {command}")
    root = Path(tempfile.mkdtemp(prefix="bench-http-"))
    on_rates: list[float] = []
    off_rates: list[float] = []
    cpu: dict[bool, list[float]] = {True: [], False: []}
    scrapes = 0
    try:
        for index in range(args.rounds):
            order = (True, False) if index % 2 == 0 else (False, True)
            for on in order:
                side = one_side(root / f"round{index}-{'on' if on else 'off'}", on, args)
                assert side["succeeded"] == args.runs, side
                (on_rates if on else off_rates).append(side["runs_per_s"])
                cpu[on].append(side["cpu_s"])
                scrapes += side["scrapes"]
                say(
                    f"round {index + 1}: http+metrics {'on ' if on else 'off'} "
                    f"{side['runs_per_s']:,.1f} runs/s, CPU {side['cpu_s']:.2f} s"
                    + (f" ({side['scrapes']} scrapes)" if on else "")
                )
    finally:
        set_recording(True)
        shutil.rmtree(root, ignore_errors=True)
    on_median, off_median = statistics.median(on_rates), statistics.median(off_rates)
    paired = statistics.median(a / b for a, b in zip(on_rates, off_rates, strict=True))
    ratio = on_median / off_median
    say(
        f"on {on_median:,.1f} runs/s, off {off_median:,.1f}: ratio {ratio:.3f} "
        f"(paired median {paired:.3f}; target >= 0.95)"
    )
    summary = {
        "bench": "http_overhead",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": cpus(),
        "runs": args.runs,
        "rounds": args.rounds,
        "workers": args.workers,
        "scrape_interval_s": args.scrape_interval,
        "scrapes": scrapes,
        "on_runs_per_s": round(on_median, 1),
        "off_runs_per_s": round(off_median, 1),
        "on_rounds": [round(r, 1) for r in on_rates],
        "off_rounds": [round(r, 1) for r in off_rates],
        "ratio": round(ratio, 4),
        "paired_ratio": round(paired, 4),
        # The process's CPU seconds a side (median): steadier than runs/s on a busy machine.
        "on_cpu_s": round(statistics.median(cpu[True]), 2),
        "off_cpu_s": round(statistics.median(cpu[False]), 2),
        "cpu_ratio": round(statistics.median(cpu[True]) / statistics.median(cpu[False]), 4),
        "command": command,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
