"""One worker process, ``--concurrency 16`` against ``--concurrency 1``: async steps that
await 50 ms of I/O, steps completed per second.

Run: ``PYTHONPATH=. python bench/worker_concurrency.py [--seconds 3] [--repeat 3] [--json]``

Each round starts one ``processor worker --app worker_concurrency:app --concurrency C
--no-http`` process on an embedded log (topics of a prefix of the round's own), waits
for it to say it is ready, produces the round's work items to segments.work at once
(one step each: ``await asyncio.sleep(0.05)``, the stand-in for a network call) and
times until every result is on segments.results: steps/s = items / that time. The
item count is what ``--seconds`` of work takes at that concurrency (50 ms a step, C at
once), so both sides run about as long. Rounds alternate 16 and 1 in the same run;
each side's figure is the median of its rounds, and the ratio (16 / 1) is printed:
the issue's target is >= 10x. Mostly sleeping: fine on a busy machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from processor.config.settings import Settings
from processor.facts import payload
from processor.facts.codec import decode, encode
from processor.facts.models import SegmentResult, WorkItem
from processor.facts.topics import TopicName
from processor.transport.base import Outbound, TopicPartition
from processor.transport.deployment import Deployment, ensure_topics
from processor.worker.pipeline import Application, Pipeline

STEP_S = 0.05
BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent

io_bound = Pipeline("io_bound", version=1)


@io_bound.step(timeout_s=60)
async def call_service(value: dict[str, Any]) -> dict[str, Any]:
    await asyncio.sleep(STEP_S)  # a downstream call's latency
    return value


app = Application([io_bound])


def command_line(argv: list[str]) -> str:
    return "PYTHONPATH=. python " + " ".join(argv)


def one_round(root: Path, concurrency: int, items: int, timeout_s: float) -> dict[str, Any]:
    """Start a worker process at ``concurrency``, hand it ``items`` steps, time them."""
    prefix = f"r{uuid.uuid4().hex[:8]}."
    settings = Settings(broker=None, data_dir=root, partitions=1, topic_prefix=prefix)
    deployment = Deployment.from_settings(settings)
    ensure_topics(deployment)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(BENCH_DIR), str(REPO), os.environ.get("PYTHONPATH", "")]
        ),
        "PROCESSOR_DATA_DIR": str(root),
        "PROCESSOR_TOPIC_PREFIX": prefix,
        "PROCESSOR_PARTITIONS": "1",
        "PROCESSOR_BROKER": "embedded",
    }
    worker = subprocess.Popen(
        [sys.executable, "-m", "processor", "worker", "--app", "worker_concurrency:app",
         "--concurrency", str(concurrency), "--no-http", "--json"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert worker.stdout is not None
        ready = worker.stdout.readline()
        if '"ready": true' not in ready:
            raise RuntimeError(f"the worker did not start: {ready!r}")
        started = time.perf_counter()
        produce(deployment, items)
        seconds = wait_results(deployment, items, started, timeout_s)
    finally:
        worker.terminate()
        worker.wait(60)
        if worker.stdout is not None:
            worker.stdout.close()
    return {
        "concurrency": concurrency,
        "items": items,
        "seconds": seconds,
        "steps_per_s": items / seconds,
    }


def produce(deployment: Deployment, items: int) -> None:
    topic = deployment.topology.name(TopicName.WORK)
    producer = deployment.transport.producer()
    for index in range(items):
        run_id = f"run-{index:06d}"
        item = WorkItem(
            run_id=run_id, pipeline="io_bound", pipeline_version=1, segment=0, attempt=1,
            generation=1, first_step=0, input=payload.dumps({"i": index}), expires_ms=0,
        )  # fmt: skip
        producer.produce(Outbound(topic, run_id.encode(), encode(item)))
    producer.flush()
    producer.close()


def wait_results(deployment: Deployment, items: int, started: float, timeout_s: float) -> float:
    """Seconds from ``started`` until ``items`` results are on segments.results."""
    tp = TopicPartition(deployment.topology.name(TopicName.RESULTS), 0)
    reader = deployment.transport.reader()
    seen, position = 0, 0
    try:
        while seen < items:
            if time.perf_counter() - started > timeout_s:
                raise TimeoutError(f"{seen} of {items} results in {timeout_s}s")
            end = reader.end_offset(tp)
            for batch in reader.read(tp, position, end):
                seen += sum(isinstance(decode(r.value), SegmentResult) for r in batch)
            position = end
            if seen < items:
                time.sleep(0.005)  # the poll interval of a deadline-bounded wait
        return time.perf_counter() - started
    finally:
        reader.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seconds", type=float, default=3.0, help="work per round, at 50 ms a step"
    )
    parser.add_argument("--repeat", type=int, default=3, help="rounds of each side, alternated")
    parser.add_argument("--high", type=int, default=16, help="the concurrency measured")
    parser.add_argument("--low", type=int, default=1, help="the baseline concurrency")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", action="store_true", help="print only the JSON summary")
    args = parser.parse_args()
    command = command_line(sys.argv)

    def say(text: str) -> None:
        if not args.json:
            print(text, flush=True)

    say(command)
    root = Path(tempfile.mkdtemp(prefix="bench-worker-concurrency-"))
    rounds: dict[int, list[dict[str, Any]]] = {args.high: [], args.low: []}
    try:
        for _ in range(args.repeat):
            for concurrency in (args.high, args.low):
                items = max(1, round(args.seconds / STEP_S * concurrency))
                result = one_round(root, concurrency, items, args.timeout)
                rounds[concurrency].append(result)
                say(
                    f"concurrency {concurrency:>2}: {items:,} steps in {result['seconds']:.2f}s"
                    f" = {result['steps_per_s']:,.1f} steps/s"
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    high = statistics.median(r["steps_per_s"] for r in rounds[args.high])
    low = statistics.median(r["steps_per_s"] for r in rounds[args.low])
    ratio = high / low
    ideal = args.high / args.low
    say(f"median steps/s: {high:,.1f} at {args.high}, {low:,.1f} at {args.low}: ratio {ratio:.2f}x"
        f" (ideal {ideal:.0f}x; target >= 10x)")  # fmt: skip
    summary = {
        "bench": "worker_concurrency",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "step_ms": STEP_S * 1000,
        "high": args.high,
        "low": args.low,
        "rounds": args.repeat,
        "steps_per_s_high": round(high, 1),
        "steps_per_s_low": round(low, 1),
        "ratio": round(ratio, 2),
        "paired_ratios": [
            round(h["steps_per_s"] / lo["steps_per_s"], 2)
            for h, lo in zip(rounds[args.high], rounds[args.low], strict=True)
        ],
        "command": command,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
