"""Every script in bench/ still runs: a tiny-size smoke run of each.

Each test runs one script as a user would (``python bench/x.py ... --json``, from
the repository root, with the repository on PYTHONPATH and a private TMPDIR) at
the smallest sizes it takes, and checks that it exits 0 and that its one-line
JSON summary holds the figures the script exists to report. The figures
themselves are meaningless at these sizes; the point is that no script rots
(bench/quix_fold.py failed for a day before anyone noticed).

Two scripts are helpers, not benchmarks:

- bench/kafka_responder.py answers the demo's payment await in a process of its
  own; the Kafka lifecycle, standard-workload and replay runs start it, and none of
  their runs can finish without it.
- bench/quix_fold_app.py is the Quix Streams side of bench/quix_fold.py. Quix
  Streams pins confluent-kafka < 2.13 and pydantic < 2.14 (bench/requirements-quix.txt),
  which conflicts with the processor's environment, so it runs in its own
  virtualenv, which the test suite does not build. The smoke test runs our side of
  the comparison (``--ours-only``), checks that asking for the comparison without
  a Quix interpreter fails loudly, and compiles quix_fold_app.py; it does not run
  Quix Streams.
"""

from __future__ import annotations

import json
import os
import py_compile
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.kafka_broker import kafka_bootstrap, unavailable_reason
from tests.schema_registry import schema_registry_url
from tests.schema_registry import unavailable_reason as registry_unavailable

#: Each runs a whole script in a process of its own: the full suite's (``make test``),
#: not the tier run between edits (``make test-fast``).
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
_TIMEOUT_S = 240.0


def _run(
    script: str, tmp_path: Path, *args: str, env_extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ) | (env_extra or {})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["TMPDIR"] = str(tmp_path)  # whatever a script leaves behind goes with tmp_path
    try:
        return subprocess.run(
            [sys.executable, str(BENCH / script), *args],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as stalled:
        pytest.fail(f"{script} stalled: {stalled}\n{_log_tails(tmp_path)}")


def _log_tails(root: Path) -> str:
    """The end of each log a stalled script's processes left under ``root``."""
    tails = [
        f"--- {log.relative_to(root)}:\n{log.read_text(errors='replace')[-3000:]}"
        for log in sorted(root.rglob("*.log"))
        if log.parent.name == "logs"  # not RocksDB's write-ahead logs
    ]
    return "\n".join(tails) or "(no process logs)"


def bench(
    script: str, tmp_path: Path, *args: str, env_extra: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run ``bench/script`` with ``--json``; its summary, once it exited 0."""
    done = _run(script, tmp_path, *args, "--json", env_extra=env_extra)
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stderr[-4000:]}"
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"{script} printed no JSON summary:\n{done.stdout[-2000:]}"
    summary: dict[str, Any] = json.loads(lines[-1])
    assert summary["bench"] == script.removesuffix(".py")
    return summary


@pytest.fixture
def bootstrap() -> str:
    """The test broker's address (skips outside CI without one; CI never skips)."""
    found = kafka_bootstrap()
    if found is None:
        pytest.skip(unavailable_reason())
    return found


def test_embedded_log_throughput(tmp_path: Path) -> None:
    out = bench("embedded_log_throughput.py", tmp_path, "--records", "1000", "--read-passes", "1")
    assert out["records"] == 1000
    for figure in ("commit", "produce", "read"):
        assert out[f"{figure}_records_per_s"] > 0
        assert out[f"{figure}_records_per_cpu_s"] > 0


def test_lifecycle_embedded(tmp_path: Path) -> None:
    out = bench("lifecycle_embedded.py", tmp_path, "--runs", "20", "--workers", "1")
    assert (out["runs"], out["succeeded"], out["failed"]) == (20, 20, 0)
    assert out["runs_per_s"] > 0 and out["baseline_round_trips_per_s"] > 0
    assert out["ratio_runs_to_round_trips"] > 0
    assert 0 < out["p50_ms"] <= out["p99_ms"]
    assert out["facts_per_run"] > 1


def test_closed_loop(tmp_path: Path) -> None:
    out = bench(
        "closed_loop.py",
        tmp_path,
        *("--transport", "embedded", "--concurrency", "2", "--runs", "10", "--warmup", "2"),
    )
    assert (out["transport"], out["concurrency"], out["runs"], out["rounds"]) == (
        "embedded",
        2,
        10,
        1,
    )
    (measured,) = out["per_round"]
    assert (measured["succeeded"], measured["failed"]) == (10, 0)
    assert out["runs_per_s"] > 0 and 0 < out["p50_ms"] <= out["p95_ms"] <= out["p99_ms"]
    assert {"processor", "processor_children", "responder", "total"} <= set(out["cpu_ms_per_run"])
    # A run commits at least one processor transaction, and writes its command, its
    # facts, a work item and result, a request and completion, and its outcome.
    assert out["transactions_per_run"] >= 1
    assert out["records_per_run"] >= 8
    assert out["markers_per_run"] is None  # the embedded log has no control records


def test_closed_loop_with_inline_steps_and_fact_batches(tmp_path: Path) -> None:
    """Issue 31's two opt-ins: a run's facts of a transaction leave as one record, so the
    records a run writes fall from about 20 (row 19) to under 12."""
    out = bench(
        "closed_loop.py",
        tmp_path,
        *("--transport", "embedded", "--concurrency", "1", "--runs", "10", "--warmup", "2"),
        *("--inline-steps", "--fact-batches"),
    )
    assert out["inline_steps"] is True and out["fact_batches"] is True
    (measured,) = out["per_round"]
    assert (measured["succeeded"], measured["failed"]) == (10, 0)
    assert 4 <= out["records_per_run"] < 12, out["records_per_run"]


def test_closed_loop_against_a_baseline(tmp_path: Path) -> None:
    """The A/B mode, against HEAD checked out as a worktree under tmp_path."""
    out = bench(
        "closed_loop.py",
        tmp_path,
        *("--transport", "embedded", "--concurrency", "2", "--runs", "6", "--warmup", "2"),
        *("--baseline-ref", "HEAD", "--repeat", "1", "--no-retries"),
    )
    assert len(out["baseline_commit"]) == 40 and out["native_fold"] is False
    assert out["no_retries"] is True  # both sides submit orders no step fails
    for side in ("current", "baseline"):
        (measured,) = out[side]["per_round"]
        assert (measured["succeeded"], measured["failed"]) == (6, 0)
        assert out[side]["runs_per_s"] > 0 and out[side]["records_per_run"] >= 8
    assert out["ratios"]["runs_per_s"] > 0 and out["ratios"]["records_per_run"] > 0


def test_worker_concurrency(tmp_path: Path) -> None:
    out = bench("worker_concurrency.py", tmp_path, "--seconds", "0.1", "--repeat", "1")
    assert (out["high"], out["low"], out["rounds"]) == (16, 1, 1)
    assert out["steps_per_s_high"] > 0 and out["steps_per_s_low"] > 0
    assert out["ratio"] > 0 and len(out["paired_ratios"]) == 1


def test_graph_parallel(tmp_path: Path) -> None:
    out = bench("graph_parallel.py", tmp_path, "--steps", "3", "--step-ms", "20", "--repeat", "1")
    assert (out["steps"], out["step_ms"], out["rounds"]) == (3, 20, 1)
    assert len(out["one_ms_rounds"]) == len(out["wide_ms_rounds"]) == 1
    assert out["one_ms"] >= 20 and out["wide_ms"] >= 20  # a run waits for its steps
    assert out["ratio"] > 0


def test_fan_out(tmp_path: Path) -> None:
    out = bench("fan_out.py", tmp_path, "--items", "30", "--max-in-flight", "4", "--repeat", "1")
    assert (out["items"], out["max_in_flight"], out["rounds"]) == (30, 4, 1)
    assert out["items_per_s"] > 0 and len(out["items_per_s_rounds"]) == 1
    # VmHWM against an earlier VmRSS: the kernel's per-thread RSS counters may lag it by
    # up to 64 pages a thread, so the peak may read a little under the start.
    assert out["rss_start_mib"] > 0
    assert out["rss_peak_mib"] > out["rss_start_mib"] - 2


def test_children(tmp_path: Path) -> None:
    out = bench("children.py", tmp_path, "--children", "5", "--repeat", "1")
    assert (out["children"], out["rounds"], out["warmup_rounds"]) == (5, 1, 1)
    assert out["independent_ms"] >= 0 and out["as_children_ms"] > 0
    assert len(out["ratio_rounds"]) == len(out["children_done_ratio_rounds"]) == 1
    assert 0 < out["children_done_ms"] <= out["as_children_ms"]  # children end first


def test_signals_by_key(tmp_path: Path) -> None:
    out = bench("signals_by_key.py", tmp_path, "--waiting", "10", "--events", "4", "--repeat", "1")
    assert (out["waiting"], out["events"], out["rounds"]) == (10, 4, 1)
    for figures in (out["by_run_id"], out["by_key"]):
        assert figures["events_per_s"] > 0 and figures["p99_ms"] >= figures["p50_ms"] > 0


def test_http_overhead(tmp_path: Path) -> None:
    out = bench(
        "http_overhead.py", tmp_path, "--runs", "20", "--rounds", "2", "--scrape-interval", "0.05"
    )
    assert (out["runs"], out["rounds"]) == (20, 2)
    assert len(out["on_rounds"]) == len(out["off_rounds"]) == 2
    assert out["on_runs_per_s"] > 0 and out["off_runs_per_s"] > 0
    assert out["ratio"] > 0 and out["paired_ratio"] > 0


def test_memory_embedded(tmp_path: Path) -> None:
    out = bench(
        "memory_embedded.py",
        tmp_path,
        *("--runs", "200", "--chunk", "100", "--checkpoint", "100", "--workers", "1"),
    )
    assert out["runs"] == 200
    assert 0 < out["rss_start_mib"] <= out["peak_rss_mib"]
    assert out["rss_final_mib"] > 0 and out["target_mib"] == 300
    assert out["under_target"] is (out["rss_final_mib"] < 300)
    assert out["samples"] and out["samples"][-1]["runs"] == 200


def test_replay_embedded(tmp_path: Path) -> None:
    out = bench(
        "replay_embedded.py",
        tmp_path,
        *("--facts", "2000", "--template-runs", "20", "--workers", "1"),
        *("--repeat", "1", "--processes", "1,2", "--digest"),
    )
    assert out["facts"] >= 2000 and out["runs"] > 0
    assert out["raw_read_facts_per_s"] > 0
    assert out["replay_processes"] == {"1": 1, "2": 2}
    for mode in ("1", "2"):
        assert out["replay_facts_per_s"][mode] > 0
        assert out["ratio_replay_to_raw_read"][mode] > 0
    assert out["digests_equal"] is True and set(out["digest"]) == {"1", "2"}


def test_replay_embedded_of_fact_batches(tmp_path: Path) -> None:
    """A journal written with fact batches: the copies keep them, the facts are counted."""
    out = bench(
        "replay_embedded.py",
        tmp_path,
        *("--facts", "2000", "--template-runs", "20", "--workers", "1"),
        *("--repeat", "1", "--processes", "1"),
        env_extra={"PROCESSOR_FACT_BATCHES": "true"},
    )
    assert out["facts"] >= 2000 and out["runs"] > 0
    assert out["facts_per_run"] > 10  # facts, not the few records a run writes
    assert out["replay_facts_per_s"]["1"] > 0


def test_http_runs_query(tmp_path: Path) -> None:
    out = bench("http_runs_query.py", tmp_path, "--runs", "300", "--queries", "2", "--limit", "50")
    assert out["runs"] == 300
    # 300 runs: 180 succeeded, 75 failed, 45 running, so every first page is full.
    assert {s: f["runs_on_page"] for s, f in out["by_status"].items()} == {
        "succeeded": 50,
        "failed": 50,
        "running": 45,
        "any": 50,
    }
    assert out["median_ms"] > 0
    assert set(out["http_by_status"]) == {"succeeded", "failed", "running"}
    assert out["http_median_ms"] > 0


@pytest.mark.kafka
def test_kafka_read_throughput(tmp_path: Path, bootstrap: str) -> None:
    out = bench(
        "kafka_read_throughput.py",
        tmp_path,
        *("--bootstrap", bootstrap, "--records", "2000", "--passes", "1"),
    )
    assert out["records"] == 2000
    assert out["reader_records_per_s"] > 0 and out["bare_records_per_s"] > 0
    assert out["ratio_reader_to_bare"] > 0


@pytest.mark.kafka
def test_kafka_transaction_floor(tmp_path: Path, bootstrap: str) -> None:
    out = bench(
        "kafka_transaction_floor.py",
        tmp_path,
        *("--bootstrap", bootstrap, "--runs", "20", "--warmup", "5", "--facts", "2"),
    )
    assert out["runs"] == 20 and out["facts_per_commit"] == 2
    assert 0 < out["p50_ms"] <= out["p99_ms"]


@pytest.mark.kafka
def test_kafka_lifecycle(tmp_path: Path, bootstrap: str) -> None:
    out = bench(
        "kafka_lifecycle.py",
        tmp_path,
        *("--bootstrap", bootstrap, "--runs", "20", "--warmup", "2", "--baseline-records", "200"),
    )
    assert (out["runs"], out["succeeded"], out["failed"]) == (20, 20, 0)
    assert out["runs_per_s"] > 0 and out["baseline_records_per_s"] > 0
    assert out["ratio_runs_to_raw_records"] > 0
    assert set(out["cpu_ms_per_run"]) == {"processor", "worker0", "responder"}


@pytest.mark.kafka
def test_kafka_standard_workload(tmp_path: Path, bootstrap: str) -> None:
    out = bench(
        "kafka_standard_workload.py",
        tmp_path,
        *("--bootstrap", bootstrap, "--runs", "10", "--paced-runs", "5", "--warmup", "2"),
        *("--baseline-records", "200"),
    )
    assert (out["saturation"]["succeeded"], out["saturation"]["failed"]) == (10, 0)
    assert (out["paced"]["succeeded"], out["paced"]["failed"]) == (5, 0)
    assert out["saturation"]["runs_per_s"] > 0 and out["baseline"]["records_per_s"] > 0
    assert out["ratios"]["saturation_runs_to_raw_records"] > 0
    assert out["ratios"]["paced_p50_to_raw"] > 0


@pytest.mark.kafka
def test_closed_loop_kafka(tmp_path: Path, bootstrap: str) -> None:
    out = bench(
        "closed_loop.py",
        tmp_path,
        *("--transport", "kafka", "--bootstrap", bootstrap, "--broker-warmup", "0"),
        *("--concurrency", "2", "--runs", "10", "--warmup", "2"),
    )
    (measured,) = out["per_round"]
    assert (measured["succeeded"], measured["failed"]) == (10, 0)
    assert out["runs_per_s"] > 0 and 0 < out["p50_ms"] <= out["p99_ms"]
    assert {"processor", "worker0", "responder", "total"} <= set(out["cpu_ms_per_run"])
    assert out["transactions_per_run"] >= 1 and out["records_per_run"] >= 8
    # Every processor transaction leaves a commit marker in each partition it wrote to.
    assert out["markers_per_run"] >= out["transactions_per_run"]


@pytest.mark.kafka
def test_kafka_registry(tmp_path: Path, bootstrap: str) -> None:
    registry = schema_registry_url()
    if registry is None:
        pytest.skip(registry_unavailable())
    out = bench(
        "kafka_registry.py",
        tmp_path,
        *("--bootstrap", bootstrap, "--registry", registry),
        *("--runs", "10", "--rounds", "1", "--warmup", "2"),
    )
    assert out["succeeded"] == out["runs"] == {"registry": 10, "single_object": 10}
    assert out["runs_per_s"]["registry"] > 0 and out["runs_per_s"]["single_object"] > 0
    assert out["registry_to_single_object"] > 0


@pytest.mark.kafka
def test_kafka_admission(tmp_path: Path, bootstrap: str) -> None:
    # The script stops its worker before the completions: whatever the processors'
    # announcement interval (here a warm-up over at once, as on a slow machine), the
    # processor must not hold the continuations until a worker loads their pipeline.
    out = bench(
        "kafka_admission.py",
        tmp_path,
        *("--bootstrap", bootstrap, "--runs", "10", "--paced", "5", "--baseline-records", "200"),
        *("--timeout", "60"),
        env_extra={"PROCESSOR_WORKER_ANNOUNCE_INTERVAL_MS": "100"},
    )
    assert out["burst"]["completions"] == 10 and out["paced"]["completions"] == 5
    assert out["burst"]["completions_per_s"] > 0 and out["baseline"]["records_per_s"] > 0
    assert out["ratios"]["burst_rate_to_raw"] > 0
    assert out["ratios"]["paced_p50_to_raw_paced"] > 0


@pytest.mark.kafka
def test_kafka_trigger_ingress(tmp_path: Path, bootstrap: str) -> None:
    out = bench(
        "kafka_trigger_ingress.py",
        tmp_path,
        *("--bootstrap", bootstrap, "--records", "1200", "--repeat", "1"),
    )
    # The script itself fails if a round submits fewer runs than records or rejects any.
    assert out["records"] == 1200 and out["rounds"] == 1
    assert out["trigger_runs_per_s"] > 0 and out["raw_consume_records_per_s"] > 0
    assert out["ratio"] > 0


@pytest.mark.kafka
def test_kafka_replay(tmp_path: Path, bootstrap: str) -> None:
    out = bench(
        "kafka_replay.py",
        tmp_path,
        *("--bootstrap", bootstrap, "--facts", "500", "--template-runs", "10"),
        *("--repeat", "1", "--processes", "1,2"),
    )
    # The script itself fails if a replay folds a different number of facts than
    # the bare consume read.
    assert out["facts"] >= 500 and out["runs"] > 0
    assert out["bare_consume_facts_per_s"] > 0
    for mode in ("1", "2"):
        assert out["replay_facts_per_s"][mode] > 0
        assert out["ratio_replay_to_bare"][mode] > 0
        assert out["replay_call_facts_per_s"][mode] > 0


@pytest.mark.kafka
def test_quix_fold_ours_only(tmp_path: Path, bootstrap: str) -> None:
    """Our side of the Quix comparison (Quix Streams itself is not installed here)."""
    out = bench(
        "quix_fold.py",
        tmp_path,
        *("--bootstrap", bootstrap, "--facts", "300", "--template-runs", "5", "--ours-only"),
    )
    assert out["facts"] >= 300
    assert out["ours_records_per_s"] > 0 and out["ours_records_per_cpu_s"] > 0
    assert out["quix_records_per_s"] == {} and out["ratio_ours_to_quix"] == {}


def test_quix_fold_without_quix_fails_loudly(tmp_path: Path) -> None:
    missing = tmp_path / "no-quix-venv" / "bin" / "python"
    done = _run("quix_fold.py", tmp_path, "--quix-python", str(missing), "--json")
    assert done.returncode == 2
    assert f"no Quix Streams interpreter at --quix-python {missing}" in done.stderr
    assert "--ours-only" in done.stderr


def test_quix_fold_app_compiles(tmp_path: Path) -> None:
    py_compile.compile(
        str(BENCH / "quix_fold_app.py"), cfile=str(tmp_path / "quix_fold_app.pyc"), doraise=True
    )
