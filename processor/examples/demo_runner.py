"""``processor demo``: start a processor and workers, run N orders, replay and verify."""

from __future__ import annotations

import secrets
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from processor.clients.client import Client, new_submit
from processor.clients.external import CompletionClient, Handler, Responder
from processor.config.settings import Settings
from processor.engine.host import Host
from processor.facts.codec import codec, encode
from processor.facts.models import (
    BoundaryCompletion,
    BoundaryCompletionAdmitted,
    BoundaryRequest,
    Rejected,
    RunOutcome,
)
from processor.facts.topics import TopicName
from processor.restore.replay import replay
from processor.transport.base import Reader, Record, TopicPartition
from processor.transport.deployment import Deployment
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
    admitted: int = 0
    rejected: int = 0
    rejected_reasons: dict[str, int] = field(default_factory=dict)
    duplicates_sent: int = 0
    forged_sent: int = 0

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
            "admitted": self.admitted,
            "rejected": self.rejected,
            "rejected_reasons": self.rejected_reasons,
            "duplicates_sent": self.duplicates_sent,
            "forged_sent": self.forged_sent,
            "replay_facts": self.replay_facts,
            "replay_verified": self.replay_verified,
        }


def run_demo(
    settings: Settings,
    app: Application,
    runs: int,
    workers: int,
    *,
    timeout_s: float = 120.0,
    handlers: Mapping[str, Handler] | None = None,
    app_ref: str | None = None,
) -> DemoReport:
    """Run ``runs`` orders end to end in a fresh deployment; then replay and verify.

    An external-system simulator answers the await steps' requests with
    ``handlers``; every 25th answer is also sent twice (a harmless duplicate) and
    once with a tampered token (refused as invalid_token), to show admission.
    With ``app_ref`` (``module:attribute`` of ``app``), the workers run in a child
    process, as in ``processor run`` (setting ``worker_isolation``).
    """
    scratch = Path(tempfile.mkdtemp(prefix="processor-demo-"))
    suffix = uuid.uuid4().hex[:8]
    settings = settings.model_copy(
        update={
            "data_dir": scratch,
            "group": f"demo-{suffix}",
            "topic_prefix": f"{settings.topic_prefix}demo-{suffix}." if settings.broker else "",
            # Self-contained: its tokens are signed and verified by this process only.
            "resume_secret": _own_secret_unless_configured(settings),
        }
    )
    deployment = Deployment.from_settings(settings)
    host = Host(deployment, app, workers=workers, app_ref=app_ref)
    chaos = _Chaos()
    responder = Responder(deployment.transport, deployment.topology, handlers or {}, after=chaos)
    responding = threading.Thread(target=responder.run, args=(host.stop_event,), daemon=True)
    try:
        host.start()
        host.workers_ready(60)
        responding.start()
        started = time.perf_counter()
        outcomes = _submit_and_collect(deployment, runs, timeout_s)
        seconds = time.perf_counter() - started
        admitted, rejected_reasons = _admission_counts(deployment, chaos.forged)
    finally:
        host.stop()
        if responding.ident is not None:  # started: the host may have refused to start
            responding.join(10)
    if host.errors:
        raise host.errors[0]
    report = replay(
        deployment.transport,
        deployment.topology,
        settings.state_dir,
        verify=True,
        native_fold=settings.native_fold,
    )
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
        admitted=admitted,
        rejected=sum(rejected_reasons.values()),
        rejected_reasons=rejected_reasons,
        duplicates_sent=chaos.duplicates,
        forged_sent=chaos.forged,
    )


def _own_secret_unless_configured(settings: Settings) -> SecretStr | None:
    """The configured secret; else, unless a key list is configured, one of its own."""
    if settings.resume_secret is not None or settings.resume_secrets is not None:
        return settings.resume_secret  # as configured: the host refuses both at once
    return SecretStr(secrets.token_hex(32))


class _Chaos:
    """Sends a duplicate and a forged copy of every 25th completion."""

    def __init__(self) -> None:
        self.seen = 0
        self.duplicates = 0
        self.forged = 0

    def __call__(
        self, request: BoundaryRequest, completion: BoundaryCompletion, client: CompletionClient
    ) -> None:
        self.seen += 1
        if self.seen % 25:
            return
        client.produce_raw(request.run_id, encode(completion))
        self.duplicates += 1
        token = completion.token
        tampered = token[:-2] + ("A" if token[-2] != "A" else "B") + token[-1]
        client.produce_raw(
            request.run_id, encode(completion.model_copy(update={"token": tampered}))
        )
        self.forged += 1


def _admission_counts(deployment: Deployment, expected_rejected: int) -> tuple[int, dict[str, int]]:
    """Admitted completions in runs.facts, and refusals in admission.rejected by reason.

    Waits (bounded) for the forged completions to be refused: they may trail the
    last run's outcome.
    """
    topology = deployment.topology
    reader = deployment.transport.reader()
    try:
        admitted = sum(
            isinstance(codec().decode(record.value), BoundaryCompletionAdmitted)
            for record in _records(reader, topology.name(TopicName.FACTS), topology.partitions)
        )
        deadline = time.monotonic() + 10
        while True:
            reasons: dict[str, int] = {}
            rejected = _records(reader, topology.name(TopicName.REJECTED), topology.partitions)
            for record in rejected:
                reason = codec().decode_as(record.value, Rejected).reason
                reasons[reason] = reasons.get(reason, 0) + 1
            if sum(reasons.values()) >= expected_rejected or time.monotonic() > deadline:
                return admitted, reasons
            time.sleep(0.02)  # polling the rejected topic
    finally:
        reader.close()


def _records(reader: Reader, topic: str, partitions: int) -> list[Record]:
    return [
        record
        for partition in range(partitions)
        for batch in reader.read(TopicPartition(topic, partition), 0)
        for record in batch
    ]


def _submit_and_collect(deployment: Deployment, runs: int, timeout_s: float) -> list[RunOutcome]:
    topology = deployment.topology
    settings = deployment.settings
    client = Client(deployment.transport, topology, settings.state_dir, group=settings.group)
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
