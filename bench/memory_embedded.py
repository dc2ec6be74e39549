"""Processor RSS while 100,000 runs complete on the embedded log (target: < 300 MiB).

Run: ``PYTHONPATH=. python bench/memory_embedded.py [--runs 100000] [--chunk 5000] [--json]``

A child process (this script with ``--child``) runs ``processor.engine.host.Host``: the
processor loop plus ``--workers`` in-process worker threads, with the bundled
``processor.examples.demo:app``. This parent submits runs in chunks through
``processor.clients.client.Client`` and keeps at most two chunks outstanding, so neither the
backlog nor the client grows with the run count; it counts ``RunOutcome``s on
``runs.results`` without keeping them. After each completed chunk it reads the
child's ``VmRSS`` (and peak ``VmHWM``) from ``/proc/<pid>/status``. psutil is not used.

Printed: RSS at startup (the same-run baseline), at 10,000 and at ``--runs``
completed runs, the growth between the two, and the ratio RSS(runs) / RSS(10k).
"""

from __future__ import annotations

import argparse
import functools
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
from typing import Any

from _support import MIB, Outcomes, command_line, cpus, engine, proc_status, submit

from processor.clients.client import Client
from processor.config.settings import Settings
from processor.engine.host import Host
from processor.transport.deployment import Deployment, ensure_topics


def child(data_dir: Path, group: str, workers: int) -> None:
    """Run the demo engine until stdin closes; answer each "breakdown" line on stdin."""
    with engine(data_dir, workers, group) as running:
        print("ready", flush=True)
        host = running.host

        def commands() -> None:
            for line in sys.stdin:
                if line.strip() == "breakdown":
                    print(json.dumps(breakdown(host)), flush=True)
            host.stop_event.set()

        threading.Thread(target=commands, daemon=True).start()
        host.wait()


_ROCKS_PROPERTIES = {
    "memtables": "rocksdb.cur-size-all-mem-tables",
    "block_cache": "rocksdb.block-cache-usage",
    "table_readers": "rocksdb.estimate-table-readers-mem",
}


def breakdown(host: Host) -> dict[str, float]:
    """Where the processor's memory is: RocksDB memtables, block caches and index/filter
    blocks summed over every column family of every partition store (MiB), and the
    Python heap's allocated blocks. Reads the loop's private stores: diagnostics only."""
    totals = dict.fromkeys(_ROCKS_PROPERTIES, 0)
    loop = host.loop
    stagings = dict(getattr(loop, "_stagings", {})) if loop is not None else {}
    for staging in stagings.values():
        families = list(getattr(staging.store, "_cf", {}).values())
        for name, prop in _ROCKS_PROPERTIES.items():
            values = []
            for family in families:
                try:
                    values.append(family.property_int_value(prop) or 0)
                except Exception:  # a store closed under us: skip it
                    continue
            # Column families that share one block cache each report the whole cache.
            shared = name == "block_cache" and len(set(values)) == 1
            totals[name] += values[0] if shared and values else sum(values)
    out = {f"rocks_{name}_mib": round(value / MIB, 1) for name, value in totals.items()}
    out["python_blocks_k"] = round(sys.getallocatedblocks() / 1000)
    return out


def sample(pid: int, done: int, elapsed: float) -> dict[str, float]:
    """One RSS reading of the processor process after ``done`` completed runs."""
    status = proc_status(pid)
    return {
        "runs": done,
        "seconds": round(elapsed, 1),
        "rss_mib": round(status["VmRSS"] / MIB, 1),
        "hwm_mib": round(status["VmHWM"] / MIB, 1),
        "anon_mib": round(status["RssAnon"] / MIB, 1),
        "file_mib": round(status["RssFile"] / MIB, 1),
    }


def ask_breakdown(proc: subprocess.Popen[str]) -> dict[str, float]:
    """Ask the processor process for its memory breakdown (one JSON line)."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("breakdown\n")
    proc.stdin.flush()
    return dict(json.loads(proc.stdout.readline()))


def drive(
    args: argparse.Namespace, proc: subprocess.Popen[str], deployment: Deployment, say: Any
) -> tuple[list[dict[str, float]], float]:
    """Submit ``args.runs`` runs in chunks, at most two chunks ahead; sample RSS per chunk."""
    outcomes = Outcomes(deployment)
    client = Client(deployment.transport, deployment.topology, deployment.settings.state_dir)
    samples = []
    submitted = 0
    started = time.perf_counter()
    deadline = time.monotonic() + args.timeout
    next_sample = min(args.checkpoint, args.runs)
    try:
        while outcomes.count < args.runs:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{outcomes.count} of {args.runs} runs in {args.timeout}s")
            if proc.poll() is not None:
                raise RuntimeError(f"the processor process exited with {proc.returncode}")
            if submitted < args.runs and submitted - outcomes.count < 2 * args.chunk:
                count = min(args.chunk, args.runs - submitted)
                submit(client, submitted, count)
                submitted += count
            time.sleep(0.05)
            done = outcomes.count_new()
            if done >= next_sample:
                point = sample(proc.pid, done, time.perf_counter() - started)
                point.update(ask_breakdown(proc))
                samples.append(point)
                say(
                    f"{done:>7,} runs done in {point['seconds']:6.1f}s "
                    f"({done / point['seconds']:,.0f} runs/s): RSS {point['rss_mib']:6.1f} MiB "
                    f"(anon {point['anon_mib']}, file {point['file_mib']}), "
                    f"peak {point['hwm_mib']:6.1f} MiB; rocks memtables "
                    f"{point.get('rocks_memtables_mib')}, block cache "
                    f"{point.get('rocks_block_cache_mib')}, index/filter "
                    f"{point.get('rocks_table_readers_mib')} MiB"
                )
                next_sample = min(args.runs, (done // args.chunk + 1) * args.chunk)
        return samples, time.perf_counter() - started
    finally:
        client.close()
        outcomes.close()


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
    say = (lambda *_: None) if args.json else functools.partial(print, flush=True)
    command = command_line(sys.argv)
    say(f"$ {command}")
    scratch = args.data_dir is None
    root = Path(tempfile.mkdtemp(prefix="bench-memory-")) if scratch else args.data_dir
    if not scratch and root.exists():
        shutil.rmtree(root)
    group = f"bench-{uuid.uuid4().hex[:8]}"
    deployment = Deployment.from_settings(Settings(data_dir=root, group=group))
    ensure_topics(deployment)
    child_args = ["--child", "--data-dir", str(root), "--group", group]
    proc = subprocess.Popen(
        [sys.executable, __file__, *child_args, "--workers", str(args.workers)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the processor process did not start")
        time.sleep(0.5)
        startup = sample(proc.pid, 0, 0.0)
        say(f"processor pid {proc.pid}: RSS at start {startup['rss_mib']:.1f} MiB")
        samples, seconds = drive(args, proc, deployment, say)
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
        "cpus": cpus(),
        "workers": args.workers,
        "runs": args.runs,
        "seconds": round(seconds, 1),
        "runs_per_s": round(args.runs / seconds, 1),
        "rss_start_mib": startup["rss_mib"],
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
        f"RSS: start {startup['rss_mib']} MiB, {at_check['runs']:,} runs "
        f"{at_check['rss_mib']} MiB, {final['runs']:,} runs {final['rss_mib']} MiB "
        f"(peak {final['hwm_mib']} MiB; target < 300 MiB)"
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
