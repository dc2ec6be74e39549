"""Replay throughput on the embedded log, against a raw read of the same facts.

Run: ``PYTHONPATH=. python bench/replay_embedded.py [--facts 1000000] [--data-dir DIR]
[--processes 1,auto] [--json]``

1. Builds (or reuses, with ``--data-dir``) a ``runs.facts`` topic of at least
   ``--facts`` facts. The facts are real: ``--template-runs`` runs (default 2,000)
   of the demo engine (``processor demo``'s pipeline, workers and payment simulator,
   see bench/_support.py) produce a template log; it is then replicated with fresh
   run ids until it holds enough facts. Each copy substitutes a new 36-character run
   id for the old one in the encoded bytes (same length, so the Avro stays valid),
   keeps the engine's own interleaving of runs, and is produced keyed by the new run
   id over 4 partitions. So the fact mix (types, sizes, interactions, retries)
   follows whatever the engine emits today, with no hand-written fact sequences.
2. Measures (a) a raw read: every value of runs.facts through
   ``transport.reader().read_values()`` (the leanest read of the log), touching each
   one; (b) ``processor.restore.replay.replay`` into fresh stores, once per ``--processes``
   mode (1: serial; auto: replay's default, one process per CPU for a replay this
   big). Prints facts/s of each and the ratio (b)/(a) (target >= 0.5), and the CPU
   seconds the machine spent on each (``machine_cpu_seconds``).

With ``PROCESSOR_FACT_BATCHES=true`` in the environment the template engine writes a
run's facts of a transaction as one record (facts/fact_batch.py), and the copies keep
those records: (a) and (b) then read the batched journal (facts counted, not records).

Replay folds with the compiled fold (``processor_native``) when it is installed;
``PROCESSOR_NATIVE_FOLD=false`` measures the Python reducers instead.

``--repeat N`` alternates (a) and (b) N times and reports medians. ``--profile FILE``
writes cProfile stats of one extra replay. ``--digest`` prints a SHA-256 of every
column family of the rebuilt stores, to prove an optimization writes the same bytes
(run the same command with the old and the new code on one ``--data-dir``).
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import heapq
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _support import (
    Outcomes,
    command_line,
    cpus,
    digest,
    engine,
    machine_cpu_seconds,
    per_cpu_second,
    submit,
)

from processor.clients.client import Client
from processor.config.settings import Settings
from processor.facts.topics import TopicName
from processor.restore.replay import ReplayReport, replay
from processor.transport.base import Outbound, TopicPartition
from processor.transport.embedded import EmbeddedTransport
from processor.transport.topology import Topology

PARTITIONS = 4
_COPY_NAMESPACE = uuid.UUID("1b0c5d3e-2f4a-4c6b-8d9e-0a1b2c3d4e5f")


def build_template(root: Path, runs: int, workers: int) -> list[tuple[bytes, bytes]]:
    """Run ``runs`` demo runs; return their records of runs.facts as (run id, value) in
    commit order (with ``PROCESSOR_FACT_BATCHES=true``, fact batches as written)."""
    with engine(root, workers) as running:
        deployment = running.deployment
        outcomes = Outcomes(deployment)
        client = Client(deployment.transport, deployment.topology, running.settings.state_dir)
        submit(client, 0, runs)
        outcomes.collect(runs, timeout_s=600)
        client.close()
        outcomes.close()
        time.sleep(0.5)  # let the last terminal-publication facts commit
        reader = deployment.transport.reader()
        records = getattr(reader, "inner", reader)  # as written: batches not expanded
        topic = deployment.topology.name(TopicName.FACTS)
        parts = []
        for partition in range(deployment.topology.partitions):
            rows = []
            for batch in records.read(TopicPartition(topic, partition), 0):
                rows += [(r.timestamp_ms, r.key or b"", r.value or b"") for r in batch]
            parts.append(rows)
        reader.close()
    # heapq.merge keeps each partition's own order, so every run's facts stay in order.
    return [(key, value) for _, key, value in heapq.merge(*parts, key=lambda row: row[0])]


def replicate(
    transport: EmbeddedTransport, topic: str, template: list[tuple[bytes, bytes]], wanted: int
) -> int:
    """Produce copies of ``template`` with fresh run ids until ``wanted`` facts exist;
    how many facts were produced."""
    facts_per_copy = sum(_facts_in(value) for _, value in template)
    producer = transport.producer()
    produced = copy = 0
    while produced < wanted:
        renamed: dict[bytes, bytes] = {}
        for old, value in template:
            new = renamed.get(old)
            if new is None:
                new = str(uuid.uuid5(_COPY_NAMESPACE, f"{copy}/{old.decode()}")).encode()
                if len(new) != len(old) or old not in value:
                    raise ValueError(f"run id {old!r} cannot be substituted in place")
                renamed[old] = new
            producer.produce(Outbound(topic, new, value.replace(old, new)))
        produced += facts_per_copy
        copy += 1
    producer.close()
    return produced


def _facts_in(value: bytes) -> int:
    from processor.facts.fact_batch import is_batch, unpack

    return len(unpack(value)) if is_batch(value) else 1


def raw_read(
    transport: EmbeddedTransport, topic: str, *, records: bool = False
) -> tuple[int, int, float, float]:
    """(a) Every value of every partition through Reader.read_values, touching each one.

    ``read_values`` is the leanest read the log offers (restore uses it too). With
    ``records``, through ``Reader.read`` instead, which builds a Record per value
    (the baseline of the figures before read_values existed).
    Returns (records, bytes, wall seconds, CPU seconds of the machine)."""
    reader = transport.reader()
    cpu = machine_cpu_seconds()
    started = time.perf_counter()
    count = size = 0
    for partition in range(PARTITIONS):
        tp = TopicPartition(topic, partition)
        batches = (
            ([r.value for r in batch] for batch in reader.read(tp, 0))
            if records
            else (values for values, _ in reader.read_values(tp, 0))
        )
        for values in batches:
            for value in values:
                size += len(value or b"")
            count += len(values)
    seconds = time.perf_counter() - started
    cpu = machine_cpu_seconds() - cpu
    reader.close()
    return count, size, seconds, cpu


def replay_once(
    transport: EmbeddedTransport, topology: Topology, target: Path | None, processes: int | None
) -> tuple[ReplayReport, float]:
    """(b) processor.restore.replay.replay of every partition into fresh stores; (report, CPU s).

    CPU: the machine's (``machine_cpu_seconds``), with the replay's pool processes.
    """
    if target is not None:
        shutil.rmtree(target, ignore_errors=True)
    cpu = machine_cpu_seconds()
    report = replay(
        transport,
        topology,
        Path("/nonexistent"),
        target_dir=target,
        processes=processes,
        native_fold=Settings().native_fold,  # PROCESSOR_NATIVE_FOLD=false: the Python fold
    )
    return report, machine_cpu_seconds() - cpu


def open_log(path: Path, topology: Topology) -> tuple[EmbeddedTransport, int]:
    """The embedded log at ``path`` with the declared topics, and how many facts it holds."""
    transport = EmbeddedTransport(path, default_partitions=PARTITIONS)
    admin = transport.admin()
    admin.create_topics(topology.specs())
    admin.close()
    reader = transport.reader()
    topic = topology.name(TopicName.FACTS)
    have = sum(reader.end_offset(TopicPartition(topic, p)) for p in range(PARTITIONS))
    reader.close()
    if have:  # facts, not records: a record may hold several (fact batches)
        have = raw_read(transport, topic)[0]
    return transport, have


def prepare(args: argparse.Namespace, root: Path, say: Any) -> tuple[EmbeddedTransport, int]:
    """The facts log under ``root``: reused when big enough, else rebuilt from a template."""
    topology = Topology(partitions=PARTITIONS)
    transport, have = open_log(root / "log", topology)
    if have >= args.facts:
        say(f"reusing {have:,} facts in {root / 'log'}")
        return transport, have
    if have:  # copies restart at 0: never append to a smaller log
        shutil.rmtree(root / "log")
        transport, have = open_log(root / "log", topology)
    shutil.rmtree(root / "template", ignore_errors=True)
    started = time.perf_counter()
    template = build_template(root / "template", args.template_runs, args.workers)
    say(
        f"template: {args.template_runs:,} demo runs, {len(template):,} facts "
        f"in {time.perf_counter() - started:.1f}s"
    )
    started = time.perf_counter()
    have = replicate(transport, topology.name(TopicName.FACTS), template, args.facts)
    say(f"replicated to {have:,} facts in {time.perf_counter() - started:.1f}s")
    return transport, have


def measure(
    args: argparse.Namespace, transport: EmbeddedTransport, root: Path, say: Any
) -> dict[str, Any]:
    """Alternate (a) and (b) in each mode ``--repeat`` times; medians, ratios, digests."""
    topology = Topology(partitions=PARTITIONS)
    topic = topology.name(TopicName.FACTS)
    reads, cpu_reads, record_reads = [], [], []
    rates: dict[str, list[float]] = {mode: [] for mode in args.processes}
    cpu_rates: dict[str, list[float]] = {mode: [] for mode in args.processes}
    used: dict[str, int] = {}
    digests: dict[str, dict[str, str]] = {}
    report = ReplayReport()
    for index in range(args.repeat):
        count, size, seconds, cpu = raw_read(transport, topic)
        reads.append(count / seconds)
        cpu_reads.append(per_cpu_second(count, cpu))
        say(
            f"(a) raw read: {count:,} records, {size / 1e6:.0f} MB in {seconds:.2f}s "
            f"(CPU {cpu:.2f}s)"
        )
        count, _, seconds, _ = raw_read(transport, topic, records=True)
        record_reads.append(count / seconds)
        say(f"(a') read with Records: {count:,} records in {seconds:.2f}s")
        for mode in args.processes:
            target = root / f"replayed-{mode}" if args.digest and index == 0 else None
            report, cpu = replay_once(transport, topology, target, _processes(mode))
            rates[mode].append(report.facts_per_s)
            cpu_rates[mode].append(per_cpu_second(report.facts, cpu))
            used[mode] = report.processes
            say(
                f"(b) replay, processes={mode} ({report.processes}): {report.facts:,} facts, "
                f"{report.runs:,} runs in {report.seconds:.2f}s (CPU {cpu:.2f}s)"
            )
            if target is not None:
                digests[mode] = digest(target, PARTITIONS)
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        replay_once(transport, topology, None, 1)
        profiler.disable()
        profiler.dump_stats(args.profile)
        say(f"profile written to {args.profile}")
    read_rate = statistics.median(reads)
    replay_rates = {mode: statistics.median(samples) for mode, samples in rates.items()}
    return {
        "runs": report.runs,
        "facts_per_run": round(report.facts / report.runs, 2) if report.runs else None,
        "raw_read_facts_per_s": round(read_rate),
        "replay_processes": used,
        "compiled_fold": report.compiled_fold,
        "replay_facts_per_s": {mode: round(rate) for mode, rate in replay_rates.items()},
        "ratio_replay_to_raw_read": {
            mode: round(rate / read_rate, 3) for mode, rate in replay_rates.items()
        },
        "target_ratio": 0.5,
        "record_read_facts_per_s": round(statistics.median(record_reads)),
        "ratio_replay_to_record_read": {
            mode: round(rate / statistics.median(record_reads), 3)
            for mode, rate in replay_rates.items()
        },
        "raw_read_samples": [round(r) for r in reads],
        "replay_samples": {mode: [round(r) for r in samples] for mode, samples in rates.items()},
        # The machine is shared and noisy: facts per CPU-second is steadier.
        "raw_read_facts_per_cpu_s": round(statistics.median(cpu_reads)),
        "replay_facts_per_cpu_s": {
            mode: round(statistics.median(samples)) for mode, samples in cpu_rates.items()
        },
        "digest": digests or None,
        "digests_equal": len({json.dumps(d, sort_keys=True) for d in digests.values()}) <= 1,
    }


def _processes(mode: str) -> int | None:
    return None if mode == "auto" else int(mode)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--facts", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=0, help="instead of --facts: ~runs x 15")
    parser.add_argument("--template-runs", type=int, default=2_000)
    parser.add_argument("--workers", type=int, default=2, help="workers of the template engine")
    parser.add_argument("--data-dir", type=Path, help="keep/reuse the log here (default: temp)")
    parser.add_argument("--repeat", type=int, default=1, help="0: only build the log")
    parser.add_argument("--profile", type=Path, help="cProfile stats of one extra replay")
    parser.add_argument("--digest", action="store_true", help="hash every rebuilt column family")
    parser.add_argument(
        "--processes",
        type=lambda text: text.split(","),
        default=["1", "auto"],
        help="replay modes, e.g. 1,auto (serial, and replay's default: one per CPU)",
    )
    parser.add_argument("--json", action="store_true", help="only the one-line JSON summary")
    args = parser.parse_args()
    if args.runs:
        args.facts = args.runs * 15
    say = (lambda *_: None) if args.json else functools.partial(print, flush=True)
    command = command_line(sys.argv)
    say(f"$ {command}")
    scratch = args.data_dir is None
    root = Path(tempfile.mkdtemp(prefix="bench-replay-")) if scratch else args.data_dir
    try:
        transport, have = prepare(args, root, say)
        if args.repeat < 1:  # build (or check) the log only
            print(json.dumps({"bench": "replay_embedded", "facts": have, "command": command}))
            return
        result = measure(args, transport, root, say)
    finally:
        if scratch:
            shutil.rmtree(root, ignore_errors=True)
    for mode, rate in result["replay_facts_per_s"].items():
        say(
            f"raw read {result['raw_read_facts_per_s']:,} facts/s, replay (processes={mode}) "
            f"{rate:,} facts/s: ratio {result['ratio_replay_to_raw_read'][mode]} (target >= 0.5)"
        )
    summary = {
        "bench": "replay_embedded",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": cpus(),
        "facts": have,
        "repeat": args.repeat,
        **result,
        "command": command,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
