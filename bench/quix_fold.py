"""A stateful per-run fold of runs.facts into RocksDB, exactly once: ours against Quix Streams.

Run: ``PYTHONPATH=. python bench/quix_fold.py --bootstrap 127.0.0.1:9092 [--facts 500000]
[--quix-python /tmp/quixvenv/bin/python] [--modes runstate,minimal] [--repeat 1]
[--ours-only] [--json]``
(Quix Streams in its own virtualenv: ``python3 -m venv /tmp/quixvenv &&
/tmp/quixvenv/bin/pip install -r bench/requirements-quix.txt``.)

The facts: a fresh 4-partition runs.facts of at least ``--facts`` real facts (the
engine's, replicated with fresh run ids; see bench/kafka_replay.py), or the one of an
earlier ``--keep`` run with ``--reuse-prefix``. Both sides read the same topic, one
after the other, in one process each, from offset 0 to the end.

Ours, ``processor.restore.replay.replay`` (restore's ``catch_up`` of each partition in turn),
with the compiled fold (``processor_native``, Rust) when it is installed, else (or
with ``PROCESSOR_NATIVE_FOLD=false``) the Python reducers; either way: per record,
decode the fact (``decode_facts``: Avro single-object into the pydantic
model), fold it into the run's RunState with ``processor.model.reduce`` (states of
the runs in the batch are staged in memory); per 10,000 records, one RocksDB
WriteBatch with each fact's history and fact-key rows, each touched run's RunState
JSON, its due-index changes and the partition's facts offset. Exactly once: the
offset is written atomically with the rows it covers (a crash resumes there), and
only committed facts are read (read_committed).

``--ours-only`` measures our side alone (no ratio): what runs without Quix Streams.

Theirs, bench/quix_fold_app.py: a Quix ``Application`` with
``processing_guarantee="exactly-once"`` and ``commit_every=10000`` (the same cadence),
the same decode (``processor.facts.codec.decode_fact`` as value deserializer) and,
per record, ``state.get`` of the run's RunState JSON, ``RunState.model_validate_json``,
the same ``reduce``, ``state.set`` of the stored run JSON (mode ``runstate``: the
same projection); or, mode ``minimal``, ``state.get``/``state.set`` of a two-field
dict (a much lighter fold than ours: Quix's floor). At each checkpoint Quix commits
its transaction (state changelog records + consumer offsets) and then writes the
state to RocksDB. Its timing starts at the first record (group join, topic checks
and changelog creation excluded); ours includes opening the stores and the reader.

The ratio is ours / theirs in records per second (target >= 2).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _support import command_line, per_cpu_second
from kafka_replay import PARTITIONS, build_template, replay_once, replicate
from kafka_support import (
    BENCH,
    REPO,
    broker_pid,
    create_topic,
    delete_topics,
    summary_head,
    unique_prefix,
)

from processor.config.settings import Settings
from processor.facts.topics import TopicName
from processor.transport.topology import Topology


def prepare(args: argparse.Namespace, prefix: str, root: Path, say: Any) -> None:
    if args.reuse_prefix:
        say(f"reusing {prefix}runs.facts")
        return
    template = build_template(args.bootstrap, f"{prefix}template.", root, args.template_runs)
    say(f"template: {args.template_runs:,} runs on the Kafka engine, {len(template):,} facts")
    topic = Topology(prefix=prefix, partitions=PARTITIONS).name(TopicName.FACTS)
    create_topic(args.bootstrap, topic, PARTITIONS)
    have = replicate(args.bootstrap, topic, template, args.facts, 1_000)
    say(f"replicated to {have:,} facts")


def ours(args: argparse.Namespace, prefix: str, processes: int) -> dict[str, Any]:
    settings = Settings(broker=f"kafka://{args.bootstrap}", topic_prefix=prefix)
    topology = Topology(prefix=prefix, partitions=PARTITIONS)
    report, _call_seconds, cpu = replay_once(settings, topology, processes, None)
    return {
        "side": "ours",
        "processes": processes,
        "records": report.facts,
        "runs": report.runs,
        "seconds": round(report.seconds, 3),
        "cpu_seconds": round(cpu, 3),
        "records_per_s": report.facts_per_s,
        "records_per_cpu_s": per_cpu_second(report.facts, cpu),
    }


def theirs(
    args: argparse.Namespace, topic: str, expected: int, mode: str, root: Path
) -> dict[str, Any]:
    state_dir = Path(tempfile.mkdtemp(prefix="quix-state-", dir=root))
    argv = [
        args.quix_python,
        str(BENCH / "quix_fold_app.py"),
        "--bootstrap", args.bootstrap,
        "--topic", topic,
        "--expected", str(expected),
        "--state-dir", str(state_dir),
        "--mode", mode,
        "--commit-every", "10000",
        "--group", f"{topic}-quix-{mode}-{state_dir.name[-8:]}",
    ]  # fmt: skip
    if args.no_changelog:
        argv.append("--no-changelog")
    env = dict(os.environ) | {"PYTHONPATH": str(REPO)}
    done = subprocess.run(
        argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=args.timeout, check=False
    )
    shutil.rmtree(state_dir, ignore_errors=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"quix app failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return dict(json.loads(lines[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--facts", type=int, default=500_000)
    parser.add_argument("--template-runs", type=int, default=2_000)
    parser.add_argument("--quix-python", default="/tmp/quixvenv/bin/python")
    parser.add_argument("--modes", type=lambda t: t.split(","), default=["runstate", "minimal"])
    parser.add_argument("--processes", type=int, default=1, help="our replay processes")
    parser.add_argument("--no-changelog", action="store_true", help="Quix without changelog")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--reuse-prefix", help="reuse the facts of an earlier --keep run")
    parser.add_argument("--keep", action="store_true", help="keep the facts topic")
    parser.add_argument(
        "--ours-only", action="store_true", help="our side alone (no Quix Streams needed)"
    )
    parser.add_argument("--json", action="store_true", help="only the one-line JSON summary")
    args = parser.parse_args()
    if args.ours_only:
        args.modes = []
    elif not Path(args.quix_python).exists():
        parser.error(
            f"no Quix Streams interpreter at --quix-python {args.quix_python}: create it as "
            "bench/requirements-quix.txt says, or pass --ours-only"
        )
    say = (lambda *_: None) if args.json else functools.partial(print, flush=True)
    command = command_line(sys.argv)
    say(f"$ {command}")
    broker = broker_pid()  # a shared broker: notice if it restarts mid-run
    prefix = args.reuse_prefix or unique_prefix("quixfold")
    topic = Topology(prefix=prefix, partitions=PARTITIONS).name(TopicName.FACTS)
    root = Path(tempfile.mkdtemp(prefix="bench-quix-fold-"))
    ours_runs: list[dict[str, Any]] = []
    theirs_runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in args.modes}
    try:
        prepare(args, prefix, root, say)
        for _ in range(args.repeat):
            mine = ours(args, prefix, args.processes)
            ours_runs.append(mine)
            say(
                f"ours: {mine['records']:,} facts in {mine['seconds']:.2f}s = "
                f"{mine['records_per_s']:,.0f}/s"
            )
            for mode in args.modes:
                quix = theirs(args, topic, mine["records"], mode, root)
                theirs_runs[mode].append(quix)
                say(
                    f"quix {mode}: {quix['records']:,} facts in {quix['first_to_last_s']:.2f}s "
                    f"= {quix['records_per_s']:,.0f}/s (to shutdown {quix['first_to_end_s']:.2f}s)"
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
        # Quix's changelog topics are named after the consumer group (which starts with
        # the topic): this run's, one way or the other.
        delete_topics(args.bootstrap, f"changelog__{prefix}")
        delete_topics(args.bootstrap, f"{prefix}template." if args.keep else prefix)
    our_rate = statistics.median(r["records_per_s"] for r in ours_runs)
    rates = {m: statistics.median(r["records_per_s"] for r in v) for m, v in theirs_runs.items()}
    ratios = {m: round(our_rate / rate, 2) for m, rate in rates.items()}
    our_cpu = statistics.median(r["records_per_cpu_s"] for r in ours_runs)
    cpu_rates = {
        m: statistics.median(r["records_per_cpu_s"] for r in v) for m, v in theirs_runs.items()
    }
    for mode, ratio in ratios.items():
        say(f"ours {our_rate:,.0f}/s vs quix {mode} {rates[mode]:,.0f}/s: {ratio}x (target >= 2)")
    summary = {
        **summary_head("quix_fold", broker, say),
        "facts": ours_runs[-1]["records"],
        "our_processes": args.processes,
        "quix_changelog": not args.no_changelog,
        "ours_records_per_s": round(our_rate),
        "quix_records_per_s": {m: round(r) for m, r in rates.items()},
        "ratio_ours_to_quix": ratios,
        "target_ratio": 2.0,
        "ours_records_per_cpu_s": round(our_cpu),
        "quix_records_per_cpu_s": {m: round(r) for m, r in cpu_rates.items()},
        "cpu_ratio_ours_to_quix": {m: round(our_cpu / r, 2) for m, r in cpu_rates.items()},
        "ours_samples": [round(r["records_per_s"]) for r in ours_runs],
        "quix_samples": {m: [round(r["records_per_s"]) for r in v] for m, v in theirs_runs.items()},
        "quix_to_shutdown_per_s": {
            m: [round(r["records_per_s_to_end"]) for r in v] for m, v in theirs_runs.items()
        },
        "command": command,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
