"""Events by correlation key against events by run id, with many runs waiting, embedded log.

Run: ``PYTHONPATH=. python bench/signals_by_key.py [--waiting 1000] [--events 200]
[--repeat 3] [--json]``

Engine: what ``processor run`` runs with the default worker settings (a
``processor.engine.host.Host``: the processor loop in this process, 2 workers at the
default ``worker_concurrency`` in their child process), with this script's ``app``:
``waiter``, an event wait (``await_event("paid", key="order")``) then one no-op step.

First ``--waiting`` runs start and wait on keys no event names (``idle-<i>``): the
crowd that a router scanning the waiting runs would pay for. Then each round,
alternated, ``--events`` more runs start and wait, and one event is sent to each:
(a) by run id (``Client.signal(run_id=...)``), (b) by correlation key
(``Client.signal(key=...)``: the event goes through the partitions, each looking up
the runs waiting on the key in its index; here one processor owns them all). A
round's figures: events per second (the events over the time from the first send to
the last outcome) and the p50/p99 from an event's send to its run's outcome (the
wait's admission, then the no-op step). The
figure is (b) against (a) in the same round, and one waiting count against another.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _support import (
    Outcomes,
    app_host,
    begin,
    cpus,
    facts_in_log,
    percentile,
    rounds_parser,
)

from processor.clients.client import Client, new_submit
from processor.transport.deployment import Deployment
from processor.worker.pipeline import Application, Pipeline

EVENT = "paid"
#: The idle runs are started this many at a time.
CHUNK = 5_000


def build_app() -> Application:
    waiter = Pipeline("waiter")
    waiter.await_event(
        EVENT, timeout_s=24 * 3600, correlate=lambda value: {"order": value["order"]}, key="order"
    )
    waiter.step("book")(lambda payment: payment)
    return Application([waiter])


app = build_app()  # what the worker child loads (``signals_by_key:app``)


def start_waiting(
    client: Client, deployment: Deployment, keys: list[str], per_run: int, timeout_s: float
) -> list[str]:
    """Start a run waiting on each of ``keys``; return their run ids once all wait
    (the facts log grew by ``per_run`` facts a run: a waiting run's count)."""
    before = facts_in_log(deployment)
    run_ids = []
    for key in keys:
        command = new_submit("waiter", {"order": key})
        client.send(command)
        run_ids.append(command.run_id)
    client.flush()
    wanted = before + per_run * len(keys)
    _wait(lambda: facts_in_log(deployment) >= wanted, timeout_s, f"{len(keys)} runs to wait")
    return run_ids


def facts_per_waiting_run(client: Client, deployment: Deployment, timeout_s: float) -> int:
    """How many facts a run has once it waits (one run, watched until it waits)."""
    before = facts_in_log(deployment)
    command = new_submit("waiter", {"order": "calibration"})
    client.send(command)
    client.flush()

    def waiting() -> bool:
        state = client.stored_status(command.run_id)
        return state is not None and state.phase == "suspended"

    _wait(waiting, timeout_s, "the calibration run to wait")
    return facts_in_log(deployment) - before


def signal_round(
    client: Client,
    deployment: Deployment,
    targets: dict[str, str],
    by_key: bool,
    timeout_s: float,
) -> dict[str, float]:
    """Send one event to each run of ``targets`` (run id -> key); its figures."""
    outcomes = Outcomes(deployment)
    sent_ms: dict[str, int] = {}
    try:
        for run_id, key in targets.items():
            sent_ms[run_id] = int(time.time() * 1000)
            if by_key:
                client.signal(EVENT, {"amount": 1}, key=key)
            else:
                client.signal(EVENT, {"amount": 1}, run_id=run_id, correlation={"order": key})
        client.flush()
        found = outcomes.collect(len(targets), timeout_s)
    finally:
        outcomes.close()
    failed = [o for o in found if o.status != "succeeded" or o.run_id not in targets]
    if failed:
        raise RuntimeError(f"{len(failed)} unexpected outcomes: {failed[0]}")
    latencies = sorted(float(o.finished_ms - sent_ms[o.run_id]) for o in found)
    span_ms = max(o.finished_ms for o in found) - min(sent_ms.values())
    return {
        "events_per_s": len(found) / max(span_ms / 1000, 0.001),
        "p50_ms": percentile(latencies, 0.50),
        "p99_ms": percentile(latencies, 0.99),
    }


def _wait(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s}s for {what}")
        time.sleep(0.05)  # polling the log's end offsets


def _median(rounds: list[dict[str, float]], name: str) -> float:
    return round(statistics.median(r[name] for r in rounds), 1)


def main() -> None:
    parser = rounds_parser(__doc__, repeat=3, timeout_s=900.0, timed="a phase")
    parser.add_argument("--waiting", type=int, default=1000, help="runs waiting on idle keys")
    parser.add_argument("--events", type=int, default=200, help="events a round")
    args = parser.parse_args()
    command, say = begin(args)
    root = Path(tempfile.mkdtemp(prefix="bench-signals-"))
    by_id: list[dict[str, float]] = []
    by_key: list[dict[str, float]] = []
    per_run = 0
    try:
        with app_host(root, build_app(), "signals_by_key:app") as (deployment, client):
            per_run = facts_per_waiting_run(client, deployment, args.timeout)
            began = time.monotonic()
            idle = [f"idle-{i}" for i in range(args.waiting)]
            for first in range(0, len(idle), CHUNK):
                chunk = idle[first : first + CHUNK]
                start_waiting(client, deployment, chunk, per_run, args.timeout)
            idle_s = time.monotonic() - began
            say(
                f"{args.waiting:,} runs waiting on idle keys ({per_run} facts each) "
                f"in {idle_s:.1f} s"
            )
            for index in range(args.repeat):
                for keyed, figures in ((False, by_id), (True, by_key)):
                    keys = [f"r{index}-{'k' if keyed else 'i'}-{i}" for i in range(args.events)]
                    runs = start_waiting(client, deployment, keys, per_run, args.timeout)
                    targets = dict(zip(runs, keys, strict=True))
                    figures.append(signal_round(client, deployment, targets, keyed, args.timeout))
                say(
                    f"round {index + 1}: by run id {by_id[-1]['events_per_s']:.0f} events/s, "
                    f"p99 {by_id[-1]['p99_ms']:.0f} ms; by key "
                    f"{by_key[-1]['events_per_s']:.0f} events/s, p99 {by_key[-1]['p99_ms']:.0f} ms"
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summary: dict[str, Any] = {
        "bench": "signals_by_key",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "waiting": args.waiting,
        "events": args.events,
        "rounds": args.repeat,
        "facts_per_waiting_run": per_run,
        "by_run_id": {name: _median(by_id, name) for name in by_id[0]},
        "by_key": {name: _median(by_key, name) for name in by_key[0]},
        "events_per_s_ratio_rounds": [
            round(k["events_per_s"] / i["events_per_s"], 2)
            for k, i in zip(by_key, by_id, strict=True)
        ],
        "cpus": cpus(),
        "command": command,
    }
    summary["events_per_s_ratio"] = statistics.median(summary["events_per_s_ratio_rounds"])
    say(
        f"median at {args.waiting:,} waiting: by key {summary['by_key']} against by run id "
        f"{summary['by_run_id']}: {summary['events_per_s_ratio']:.2f}x the events/s "
        f"({cpus()} CPUs)"
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
