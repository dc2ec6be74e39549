"""``processor demo``: start a processor and workers, run N orders, replay and verify."""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from processor.client import Client, new_submit
from processor.facts.codec import codec
from processor.facts.models import RunOutcome
from processor.facts.topics import TopicName
from processor.host import Deployment, Host
from processor.replay import replay
from processor.settings import Settings
from processor.transport.base import Reader, TopicPartition
from processor.worker.pipeline import Application

__all__ = ["DemoReport", "run_demo"]


@dataclass
class DemoReport:
    submitted: int
    succeeded: int
    failed: int
    seconds: float
    runs_per_s: float
    p50_ms: float
    p99_ms: float
    replay_facts: int
    replay_verified: bool | None
    transport: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "transport": self.transport,
            "submitted": self.submitted,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "seconds": round(self.seconds, 3),
            "runs_per_s": round(self.runs_per_s, 1),
            "p50_ms": round(self.p50_ms, 1),
            "p99_ms": round(self.p99_ms, 1),
            "replay_facts": self.replay_facts,
            "replay_verified": self.replay_verified,
        }


def run_demo(
    settings: Settings, app: Application, runs: int, workers: int, timeout_s: float = 120.0
) -> DemoReport:
    """Run ``runs`` orders end to end in a fresh deployment; then replay and verify."""
    scratch = Path(tempfile.mkdtemp(prefix="processor-demo-"))
    suffix = uuid.uuid4().hex[:8]
    settings = settings.model_copy(
        update={
            "data_dir": scratch,
            "group": f"demo-{suffix}",
            "topic_prefix": f"{settings.topic_prefix}demo-{suffix}." if settings.broker else "",
        }
    )
    deployment = Deployment.from_settings(settings)
    host = Host(deployment, app, workers=workers)
    try:
        host.start()
        started = time.perf_counter()
        outcomes = _submit_and_collect(deployment, runs, timeout_s)
        seconds = time.perf_counter() - started
    finally:
        host.stop()
    if host.errors:
        raise host.errors[0]
    report = replay(deployment.transport, deployment.topology, settings.state_dir, verify=True)
    shutil.rmtree(scratch, ignore_errors=True)
    latencies = sorted(o.finished_ms - o.submitted_ms for o in outcomes)
    return DemoReport(
        submitted=runs,
        succeeded=sum(o.status == "succeeded" for o in outcomes),
        failed=sum(o.status == "failed" for o in outcomes),
        seconds=seconds,
        runs_per_s=len(outcomes) / seconds if seconds else 0.0,
        p50_ms=_percentile(latencies, 0.50),
        p99_ms=_percentile(latencies, 0.99),
        replay_facts=report.facts,
        replay_verified=report.verified,
        transport=deployment.transport.name,
    )


def _submit_and_collect(deployment: Deployment, runs: int, timeout_s: float) -> list[RunOutcome]:
    topology = deployment.topology
    client = Client(deployment.transport, topology, deployment.settings.state_dir)
    reader = deployment.transport.reader()
    results = topology.name(TopicName.OUTCOMES)
    partitions = [TopicPartition(results, p) for p in range(topology.partitions)]
    positions = {tp: reader.end_offset(tp) for tp in partitions}
    try:
        for index in range(runs):
            order = {"order_id": f"order-{index:06d}", "amount": 10 + index % 90}
            client.send(new_submit("orders", order))
        client.flush()
        return _collect(reader, positions, runs, timeout_s)
    finally:
        client.close()
        reader.close()


def _collect(
    reader: Reader, positions: dict[TopicPartition, int], expected: int, timeout_s: float
) -> list[RunOutcome]:
    outcomes: dict[str, RunOutcome] = {}
    deadline = time.monotonic() + timeout_s
    while len(outcomes) < expected:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(outcomes)} of {expected} runs finished in {timeout_s}s")
        progressed = False
        for tp, start in positions.items():
            for records in reader.read(tp, start):
                for record in records:
                    outcome = codec().decode_as(record.value, RunOutcome)
                    outcomes[outcome.run_id] = outcome
                    positions[tp] = record.offset + 1
                    progressed = True
        if not progressed:
            time.sleep(0.02)  # polling the results topic
    return list(outcomes.values())


def _percentile(sorted_values: list[int], fraction: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, round(fraction * (len(sorted_values) - 1)))
    return float(sorted_values[index])
