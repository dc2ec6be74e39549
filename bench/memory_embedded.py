"""Processor RSS while 100,000 runs complete on the embedded log (target: < 300 MiB).

Run: ``PYTHONPATH=. python bench/memory_embedded.py [--runs 100000] [--chunk 5000] [--json]``

A child process (this script with ``--child``) runs ``processor.host.Host``: the
processor loop plus ``--workers`` in-process worker threads, with the bundled
``processor.examples.demo:app``. This parent submits runs in chunks through
``processor.client.Client`` and keeps at most two chunks outstanding, so neither the
backlog nor the client grows with the run count; it counts ``RunOutcome``s on
``runs.results`` without keeping them. After each completed chunk it reads the
child's ``VmRSS`` (and peak ``VmHWM``) from ``/proc/<pid>/status``. psutil is not used.

Printed: RSS at startup (the same-run baseline), at 10,000 and at ``--runs``
completed runs, the growth between the two, and the ratio RSS(runs) / RSS(10k).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from processor.client import Client, new_submit
from processor.facts.topics import TopicName
from processor.host import Deployment, Host
from processor.settings import Settings
from processor.transport.base import TopicPartition

MIB = 1024 * 1024


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssFile of ``pid`` in bytes, from /proc/<pid>/status."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in {"VmRSS", "VmHWM", "RssAnon", "RssFile"}:
            out[name] = int(value.split()[0]) * 1024
    return out


def child(data_dir: Path, group: str, workers: int) -> None:
    """Run the processor and in-process workers until stdin closes."""
    settings = Settings(data_dir=data_dir, group=group)
    host = Host(Deployment.from_settings(settings), _app(), workers=workers)
    host.start()
    print("ready", flush=True)
    threading.Thread(target=lambda: (sys.stdin.read(), host.stop_event.set()), daemon=True).start()
    host.wait()
    host.stop()
    if host.errors:
        raise host.errors[0]


def _app():  # imported lazily so the parent does not load the example's worker code
    from processor.examples.demo import app

    return app


class Outcomes:
    """Counts RunOutcomes on runs.results from the positions at creation."""

    def __init__(self, deployment: Deployment) -> None:
        self.reader = deployment.transport.reader()
        topic = deployment.topology.name(TopicName.OUTCOMES)
        parts = range(deployment.topology.partitions)
        self.positions = {
            tp: self.reader.end_offset(tp) for tp in (TopicPartition(topic, p) for p in parts)
        }
        self.count = 0

    def poll(self) -> int:
        for tp, start in self.positions.items():
            end = self.reader.end_offset(tp)
            if end > start:
                self.count += end - start  # one outcome per run; no duplicates are produced
                self.positions[tp] = end
        return self.count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--chunk", type=int, default=5_000)
    parser.add_argument("--checkpoint", type=int, default=10_000, help="first RSS reading")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--data-dir", type=Path, help="keep the log and stores here")
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--json", action="store_true", help="only the one-line JSON summary")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--group", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.data_dir, args.group, args.workers)
        return
    say = (lambda *_: None) if args.json else print
    command = "PYTHONPATH=. python " + " ".join(sys.argv)
    say(f"$ {command}")
    scratch = args.data_dir is None
    root = Path(tempfile.mkdtemp(prefix="bench-memory-")) if scratch else args.data_dir
    if not scratch and root.exists():
        shutil.rmtree(root)
    group = f"bench-{uuid.uuid4().hex[:8]}"
    settings = Settings(data_dir=root, group=group)
    deployment = Deployment.from_settings(settings)
    from processor.host import ensure_topics

    ensure_topics(deployment)
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", "--data-dir", str(root), "--group", group]
        + ["--workers", str(args.workers)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ,
    )
    samples: list[dict[str, float]] = []
    try:
        assert proc.stdout is not None and proc.stdin is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the processor process did not start")
        time.sleep(0.5)
        startup = proc_status(proc.pid)
        say(f"processor pid {proc.pid}: RSS at start {startup['VmRSS'] / MIB:.1f} MiB")
        outcomes = Outcomes(deployment)
        client = Client(deployment.transport, deployment.topology, settings.state_dir)
        submitted = 0
        started = time.perf_counter()
        deadline = time.monotonic() + args.timeout
        next_sample = min(args.checkpoint, args.runs)
        while outcomes.count < args.runs:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{outcomes.count} of {args.runs} runs in {args.timeout}s")
            if proc.poll() is not None:
                raise RuntimeError(f"the processor process exited with {proc.returncode}")
            if submitted < args.runs and submitted - outcomes.count < 2 * args.chunk:
                for index in range(submitted, min(submitted + args.chunk, args.runs)):
                    order = {"order_id": f"order-{index:07d}", "amount": 10 + index % 90}
                    client.send(new_submit("orders", order))
                client.flush()
                submitted = min(submitted + args.chunk, args.runs)
            time.sleep(0.05)
            done = outcomes.poll()
            if done >= next_sample:
                status = proc_status(proc.pid)
                elapsed = time.perf_counter() - started
                samples.append(
                    {
                        "runs": done,
                        "seconds": round(elapsed, 1),
                        "rss_mib": round(status["VmRSS"] / MIB, 1),
                        "hwm_mib": round(status["VmHWM"] / MIB, 1),
                        "anon_mib": round(status["RssAnon"] / MIB, 1),
                        "file_mib": round(status["RssFile"] / MIB, 1),
                    }
                )
                say(
                    f"{done:>7,} runs done in {elapsed:6.1f}s ({done / elapsed:,.0f} runs/s): "
                    f"RSS {status['VmRSS'] / MIB:6.1f} MiB (anon {status['RssAnon'] / MIB:.1f}, "
                    f"file {status['RssFile'] / MIB:.1f}), peak {status['VmHWM'] / MIB:6.1f} MiB"
                )
                next_sample = min(args.runs, (done // args.chunk + 1) * args.chunk)
        seconds = time.perf_counter() - started
        client.close()
        outcomes.reader.close()
        proc.stdin.close()
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if scratch:
            shutil.rmtree(root, ignore_errors=True)
    at_check = next(s for s in samples if s["runs"] >= min(args.checkpoint, args.runs))
    final = samples[-1]
    summary = {
        "bench": "memory_embedded",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": len(os.sched_getaffinity(0)),
        "workers": args.workers,
        "runs": args.runs,
        "seconds": round(seconds, 1),
        "runs_per_s": round(args.runs / seconds, 1),
        "rss_start_mib": round(startup["VmRSS"] / MIB, 1),
        "rss_at_checkpoint_mib": at_check["rss_mib"],
        "checkpoint_runs": at_check["runs"],
        "rss_final_mib": final["rss_mib"],
        "peak_rss_mib": final["hwm_mib"],
        "growth_checkpoint_to_final_mib": round(final["rss_mib"] - at_check["rss_mib"], 1),
        "ratio_final_to_checkpoint": round(final["rss_mib"] / at_check["rss_mib"], 3),
        "target_mib": 300,
        "under_target": final["hwm_mib"] < 300,
        "samples": samples,
        "command": command,
    }
    say(
        f"RSS: start {summary['rss_start_mib']} MiB, {at_check['runs']:,} runs "
        f"{at_check['rss_mib']} MiB, {final['runs']:,} runs {final['rss_mib']} MiB "
        f"(peak {final['hwm_mib']} MiB; target < 300 MiB)"
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
