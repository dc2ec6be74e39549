"""The first page of a runs listing over 100,000 runs, from the runs index.

Run: ``PYTHONPATH=. python bench/http_runs_query.py [--runs 100000] [--partitions 4]
[--queries 20] [--limit 50] [--data-dir DIR] [--json]``

1. Builds (or reuses, with ``--data-dir``) one store per partition holding ``--runs``
   runs: synthetic facts (each run submitted, then 60 % succeeded, 25 % failed, the
   rest still running; two pipelines; a submit time each) folded straight into the
   stores, with the compiled fold when it is installed (else ``Staging``), as
   catch-up would.
2. Opens the stores as the CLI and the HTTP API read them (secondary readers,
   ``store/readers.py``) and times ``list_runs(RunQuery(status=...), limit=50)``, the
   first page, ``--queries`` times per status, each after a ``refresh`` (as a server
   answers a request); prints the median and the worst, in milliseconds, with and
   without the refresh (``median_ms``: the slowest status's median). The issue's
   target: the first page in under 50 ms. Also times the listing of every status
   (``any``: a merge of each status's rows).
3. Serves the same stores with the HTTP API (``processor/web``, uvicorn on a free
   port, the embedded log of the data directory) and times ``GET
   /api/runs?status=...&limit=50`` over real HTTP the same way (``http_median_ms``:
   the slowest status's median): the issue's figure, a request as a user sends it.
"""

from __future__ import annotations

import argparse
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
from urllib.parse import urlencode
from urllib.request import urlopen

from _support import command_line

from processor.config.settings import Settings
from processor.facts.codec import decode_fact, encode
from processor.facts.models import FactHeader, RunFailed, RunSubmitted, RunSucceeded
from processor.store.listing import RunQuery, list_runs
from processor.store.native_fold import NativeFold, native_fold_available
from processor.store.readers import open_readers, refresh
from processor.store.rocks import PartitionStore, store_path
from processor.store.staging import Staging
from processor.transport.deployment import Deployment
from processor.transport.partitioner import partition_for
from processor.web.app import create_app
from processor.web.context import Readiness, WebContext
from processor.web.server import HttpServer

_NAMESPACE = uuid.UUID("6d1f3a52-0c9e-4b7a-9f3e-5b2d8c4a1e07")
_BATCH = 5_000
_STATUSES = ("succeeded", "failed", "running")


def run_facts(n: int) -> list[FactHeader]:
    """The facts of synthetic run ``n``."""
    run_id = str(uuid.uuid5(_NAMESPACE, str(n)))
    submitted_ms = 1_700_000_000_000 + n * 37

    def header(seq: int, key: str) -> dict[str, Any]:
        return {
            "run_id": run_id,
            "seq": seq,
            "fact_key": key,
            "time_ms": submitted_ms + seq,
            "cause_id": f"c-{n}",
        }

    pipeline = "orders" if n % 2 else "refunds"
    facts: list[FactHeader] = [
        RunSubmitted(
            **header(1, "submitted"),
            pipeline=pipeline,
            pipeline_version=1,
            input=b'{"n": %d}' % n,
            submitted_ms=submitted_ms,
        )
    ]
    outcome = n % 20
    if outcome < 12:
        facts.append(RunSucceeded(**header(2, "succeeded"), result=b'{"ok": true}'))
    elif outcome < 17:
        facts.append(
            RunFailed(**header(2, "failed"), error="boom", error_type="E", step=0, attempts=1)
        )
    return facts


def build(root: Path, runs: int, partitions: int) -> float:
    """Fold ``runs`` synthetic runs into fresh stores under ``root``; the seconds it took."""
    started = time.perf_counter()
    by_partition: list[list[bytes]] = [[] for _ in range(partitions)]
    for n in range(runs):
        facts = run_facts(n)
        partition = partition_for(facts[0].run_id.encode(), partitions)
        by_partition[partition] += [encode(fact) for fact in facts]
    for partition, values in enumerate(by_partition):
        store = PartitionStore(store_path(root, partition))
        try:
            fold(store, values)
        finally:
            store.close()
    return time.perf_counter() - started


def fold(store: PartitionStore, values: list[bytes]) -> None:
    """Fold ``values`` in batches, as catch-up does (compiled when installed)."""
    native = NativeFold(store) if native_fold_available() else None
    staging = Staging(store, carry=True)
    for start in range(0, len(values), _BATCH):
        batch = values[start : start + _BATCH]
        offset = start + len(batch)
        if native is not None and native.fold(batch, offset):
            continue
        staging.fold_read([(decode_fact(value), value) for value in batch])
        staging.flush(offset, wal=False)
    store.persist()


def measure(root: Path, queries: int, limit: int) -> dict[str, Any]:
    stores = open_readers(root)
    try:
        figures: dict[str, Any] = {}
        for status in (*_STATUSES, None):
            query = RunQuery(status=status)
            with_refresh, query_only = [], []
            shown = 0
            for _ in range(queries):
                started = time.perf_counter()
                for store in stores:
                    refresh(store)
                refreshed = time.perf_counter()
                page = list_runs(stores, query, None, limit)
                ended = time.perf_counter()
                with_refresh.append((ended - started) * 1000)
                query_only.append((ended - refreshed) * 1000)
                shown = len(page.runs)
            figures[status or "any"] = {
                "median_ms": round(statistics.median(with_refresh), 3),
                "max_ms": round(max(with_refresh), 3),
                "query_median_ms": round(statistics.median(query_only), 3),
                "runs_on_page": shown,
            }
        return figures
    finally:
        for store in stores:
            store.close()


def measure_http(
    data_dir: Path, partitions: int, queries: int, limit: int, shown: dict[str, int]
) -> dict[str, Any]:
    """Median and worst milliseconds of ``GET /api/runs?status=S`` (first page), by status;
    each page must hold ``shown[S]`` runs, as the store query's did."""
    deployment = Deployment.from_settings(Settings(data_dir=data_dir, partitions=partitions))
    context = WebContext("127.0.0.1", None, lambda: Readiness(True), deployment=deployment)
    server = HttpServer(create_app(context), "127.0.0.1", 0)
    address = server.start()
    figures: dict[str, Any] = {}
    try:
        for status in _STATUSES:
            times = []
            for _ in range(queries):
                # A connection per request, as curl opens, with the standard library:
                # httpx's kept-alive connection waits ~40 ms on a second request (Nagle
                # and delayed ACK on its side) and a new httpx client builds a TLS
                # context (~30 ms); neither is the server's time.
                url = f"{address}/api/runs?{urlencode({'status': status, 'limit': limit})}"
                started = time.perf_counter()
                with urlopen(url) as answer:
                    body = json.loads(answer.read())
                times.append((time.perf_counter() - started) * 1000)
                assert len(body["runs"]) == shown[status], str(body)[:200]
            figures[status] = {
                "median_ms": round(statistics.median(times), 3),
                "max_ms": round(max(times), 3),
            }
    finally:
        server.stop()
        context.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--queries", type=int, default=20)
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--data-dir", type=Path, help="keep (or reuse) the stores here")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    scratch = args.data_dir is None
    data_dir = Path(tempfile.mkdtemp(prefix="bench-runs-query-")) if scratch else args.data_dir
    root = Settings(data_dir=data_dir).state_dir  # where `processor run` keeps its stores
    try:
        built_s = None
        if not (store_path(root, 0) / "CURRENT").exists():
            built_s = build(root, args.runs, args.partitions)
        figures = measure(root, args.queries, args.limit)
        shown = {status: figures[status]["runs_on_page"] for status in _STATUSES}
        over_http = measure_http(data_dir, args.partitions, args.queries, args.limit, shown)
    finally:
        if scratch:
            shutil.rmtree(data_dir, ignore_errors=True)
    summary = {
        "bench": "http_runs_query",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "runs": args.runs,
        "partitions": args.partitions,
        "limit": args.limit,
        "queries": args.queries,
        "compiled_fold": native_fold_available(),
        "build_s": None if built_s is None else round(built_s, 2),
        "median_ms": max(figures[status]["median_ms"] for status in _STATUSES),
        "target_ms": 50,
        "by_status": figures,
        "http_median_ms": max(f["median_ms"] for f in over_http.values()),
        "http_by_status": over_http,
        "command": command_line(sys.argv),
    }
    if args.json:
        print(json.dumps(summary))
        return
    for status, figure in figures.items():
        print(
            f"status={status}: first page of {figure['runs_on_page']} in "
            f"{figure['median_ms']} ms median (max {figure['max_ms']} ms; "
            f"query alone {figure['query_median_ms']} ms)"
        )
    for status, figure in over_http.items():
        print(
            f"GET /api/runs?status={status}: {figure['median_ms']} ms median "
            f"(max {figure['max_ms']} ms)"
        )
    print(f"built {args.runs} runs in {summary['build_s']} s" if built_s else "reused stores")


if __name__ == "__main__":
    main()
