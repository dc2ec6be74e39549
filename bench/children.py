"""A parent with N child runs against N independent runs, on the embedded log.

Run: ``PYTHONPATH=. python bench/children.py [--children 1000] [--repeat 3] [--warmup 1] [--json]``

Engine: what ``processor run`` runs with the default worker settings (a
``processor.engine.host.Host``: the processor loop in this process, 2 workers at the
default ``worker_concurrency`` in their child process), with this script's ``app``:
``kid``, one no-op step; ``parent``, one child step (``Pipeline.child``, itemized, no
limit in flight) that starts one ``kid`` run per item of its input.

A warm-up round of both, not counted, comes first (``--warmup 0`` leaves it out): the
first runs of a fresh host are slower, and the independent side, timed first, would
make the first round's figure look better than the others. Then each round,
alternated: (a) ``--children`` independent ``kid`` runs submitted at once,
timed from the first submit to the last outcome (``finished_ms`` of runs.results);
(b) one ``parent`` run of ``--children`` items, timed from its submit to its last
child's outcome (``children_done_ms``: "time to all children done", issue 29's
figure) and to its own outcome (``as_children_ms``: after every child's outcome has
been admitted, the parent's step released and the run ended). The figures are
(b) / (a), both: what starting runs as children, and bringing their outcomes back
through admission, costs over the same runs started by a client (issue 29's target:
at most 1.5). ``ratio`` is the stricter one, to the parent's outcome.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _support import Outcomes, app_host, begin, cpus, rounds_parser

from processor.clients.client import Client, new_submit
from processor.transport.deployment import Deployment
from processor.worker.pipeline import Application, Pipeline


def build_app() -> Application:
    kid = Pipeline("kid")
    kid.step("touch")(lambda value: value)
    parent = Pipeline("parent")
    parent.child("kid", name="start_kids", timeout_s=3600, itemized=True)(
        lambda value: list(range(value["children"]))
    )
    return Application([kid, parent])


app = build_app()  # what the worker child loads (``children:app``)


def independent(client: Client, deployment: Deployment, n: int, timeout_s: float) -> float:
    """ms from the first of ``n`` kid submits to the last kid's outcome."""
    outcomes = Outcomes(deployment)
    try:
        for index in range(n):
            client.send(new_submit("kid", index))
        client.flush()
        found = outcomes.collect(n, timeout_s)
    finally:
        outcomes.close()
    _all_succeeded(found)
    return float(max(o.finished_ms for o in found) - min(o.submitted_ms for o in found))


def as_children(
    client: Client, deployment: Deployment, n: int, timeout_s: float
) -> tuple[float, float]:
    """ms from a parent's submit to its outcome, and to its last child's outcome (its
    ``n`` children end before it: their outcomes are admitted by the parent first)."""
    outcomes = Outcomes(deployment)
    try:
        command = new_submit("parent", {"children": n})
        client.send(command)
        client.flush()
        found = outcomes.collect(n + 1, timeout_s)
    finally:
        outcomes.close()
    _all_succeeded(found)
    (parent,) = [o for o in found if o.run_id == command.run_id]
    children_done = max(o.finished_ms for o in found if o.run_id != command.run_id)
    return (
        float(parent.finished_ms - parent.submitted_ms),
        float(children_done - parent.submitted_ms),
    )


def _all_succeeded(found: list[Any]) -> None:
    failed = [o for o in found if o.status != "succeeded"]
    if failed:
        raise RuntimeError(f"{len(failed)} runs did not succeed: {failed[0]}")


def main() -> None:
    parser = rounds_parser(__doc__, repeat=3, timeout_s=600.0, timed="a round")
    parser.add_argument("--children", type=int, default=1000, help="runs in each round")
    parser.add_argument("--warmup", type=int, default=1, help="rounds not counted, first")
    args = parser.parse_args()
    command, say = begin(args)
    root = Path(tempfile.mkdtemp(prefix="bench-children-"))
    alone: list[float] = []
    nested: list[float] = []
    children_done: list[float] = []
    try:
        with app_host(root, build_app(), "children:app") as (deployment, client):
            for _ in range(args.warmup):
                independent(client, deployment, args.children, args.timeout)
                as_children(client, deployment, args.children, args.timeout)
            for index in range(args.repeat):
                alone.append(independent(client, deployment, args.children, args.timeout))
                parent_ms, done_ms = as_children(client, deployment, args.children, args.timeout)
                nested.append(parent_ms)
                children_done.append(done_ms)
                say(
                    f"round {index + 1}: {args.children:,} runs {alone[-1]:.0f} ms, "
                    f"as children {done_ms:.0f} ms to the last child's end, "
                    f"{parent_ms:.0f} ms to the parent's"
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ratios = [n / a for n, a in zip(nested, alone, strict=True)]
    ratio = statistics.median(ratios)
    done_ratios = [d / a for d, a in zip(children_done, alone, strict=True)]
    say(
        f"median: {args.children:,} runs {statistics.median(alone):.0f} ms; as children, "
        f"all children done {statistics.median(children_done):.0f} ms "
        f"({statistics.median(done_ratios):.2f}x), the parent's outcome "
        f"{statistics.median(nested):.0f} ms ({ratio:.2f}x) ({cpus()} CPUs)"
    )
    summary = {
        "bench": "children",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "children": args.children,
        "rounds": args.repeat,
        "warmup_rounds": args.warmup,
        "independent_ms": round(statistics.median(alone), 1),
        "as_children_ms": round(statistics.median(nested), 1),
        "ratio": round(ratio, 2),
        "ratio_rounds": [round(r, 2) for r in ratios],
        "children_done_ms": round(statistics.median(children_done), 1),
        "children_done_ratio": round(statistics.median(done_ratios), 2),
        "children_done_ratio_rounds": [round(r, 2) for r in done_ratios],
        "cpus": cpus(),
        "command": command,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
