"""The processor's Prometheus metrics: one registry, ``REGISTRY``, every name ``processor_*``.

The hooks are cheap by design: the loop adds up what a transaction did while it
decides (plain Python lists) and records it here once per committed transaction
(``record_transaction``); gauges that need counting over the stores are computed
at scrape time by a collector (``processor/web/collector.py``), so nothing is
counted per fact. Every metric is described in README.md, "HTTP API and metrics".
"""

from __future__ import annotations

import functools
from collections import Counter as Tally
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

__all__ = [
    "DECISIONS_QUARANTINED",
    "INLINE_SEGMENTS",
    "KEYED_EVENT_COPIES",
    "LOCAL_INPUTS",
    "PROGRESS_REFUSED",
    "QUARANTINE_FAILED",
    "REGISTRY",
    "REJECTED",
    "RESTORE_FACTS",
    "RESTORE_REMAINING",
    "RUNS_FINISHED",
    "RUNS_STARTED",
    "RUN_SECONDS",
    "STEP_DEADLINE_WARNINGS",
    "STEP_SECONDS",
    "TIMERS_DUE",
    "TIMERS_FIRED",
    "TRANSACTION_INPUTS",
    "TRANSACTION_SECONDS",
    "Relay",
    "TransactionTally",
    "apply_relayed",
    "count_deadline_warning",
    "count_worker_rejection",
    "observe_step",
    "record_transaction",
    "recording",
    "relay_to",
    "set_recording",
]

# No ``*_created`` series: a timestamp per label set is noise on every scrape.
disable_created_metrics()  # type: ignore[no-untyped-call]
REGISTRY = CollectorRegistry()  # collectors are described when scraped, not registered

# Runs last from milliseconds to days; steps from microseconds to minutes.
_RUN_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600, 86400)
_STEP_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120)
_COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)
_INPUT_BUCKETS = (0, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 5000)

RUNS_STARTED = Counter(
    "processor_runs_started",
    "Runs created (RunSubmitted committed), by pipeline",
    ["pipeline"],
    registry=REGISTRY,
)
RUNS_FINISHED = Counter(
    "processor_runs_finished",
    "Runs that reached a terminal status, by pipeline and outcome "
    "(succeeded, failed, cancelled, timed_out)",
    ["pipeline", "outcome"],
    registry=REGISTRY,
)
RUN_SECONDS = Histogram(
    "processor_run_duration_seconds",
    "Submit to result: from the run's submit time to its terminal fact, by pipeline and outcome",
    ["pipeline", "outcome"],
    buckets=_RUN_BUCKETS,
    registry=REGISTRY,
)
STEP_SECONDS = Histogram(
    "processor_step_duration_seconds",
    "Time a worker spent in one step function, by pipeline and step",
    ["pipeline", "step"],
    buckets=_STEP_BUCKETS,
    registry=REGISTRY,
)
STEP_DEADLINE_WARNINGS = Counter(
    "processor_step_deadline_warnings",
    "Step attempts that used 75 % of their timeout (a worker's deadline warning), by "
    "pipeline and step",
    ["pipeline", "step"],
    registry=REGISTRY,
)
TRANSACTION_SECONDS = Histogram(
    "processor_transaction_commit_seconds",
    "Latency of one processor transaction: produce facts and outbound records, commit "
    "them with the consumed offsets",
    buckets=_COMMIT_BUCKETS,
    registry=REGISTRY,
)
TRANSACTION_INPUTS = Histogram(
    "processor_transaction_inputs",
    "Input records handled by one committed transaction",
    buckets=_INPUT_BUCKETS,
    registry=REGISTRY,
)
REJECTED = Counter(
    "processor_rejected_inputs",
    "Inputs refused to admission.rejected, by reason",
    ["reason"],
    registry=REGISTRY,
)
KEYED_EVENT_COPIES = Counter(
    "processor_keyed_event_copies",
    "Copies of events by correlation key decided on a partition, by what they found: "
    "'matched' (a waiting run admitted it) or 'unmatched' (no run here waits on the key)",
    ["found"],
    registry=REGISTRY,
)
PROGRESS_REFUSED = Counter(
    "processor_progress_refused",
    "Attempt progress reports (started, heartbeat) refused as late or repeated, by reason",
    ["reason"],
    registry=REGISTRY,
)
DECISIONS_QUARANTINED = Counter(
    "processor_decisions_quarantined",
    "Decisions that raised and quarantined their run, by source (timer, wake, input, restore)",
    ["source"],
    registry=REGISTRY,
)
QUARANTINE_FAILED = Counter(
    "processor_quarantine_failures",
    "Quarantines that raised too (the fold is broken): the run is skipped until a restart",
    registry=REGISTRY,
)
INLINE_SEGMENTS = Counter(
    "processor_inline_segments",
    "Segments the processor ran itself before committing (PROCESSOR_INLINE_STEPS)",
    registry=REGISTRY,
)
LOCAL_INPUTS = Counter(
    "processor_local_inputs",
    "Completions for runs of the processor's own partitions (a child's outcome for its "
    "parent) decided in the batch that sent them, never produced to runs.completions",
    registry=REGISTRY,
)
TIMERS_FIRED = Counter(
    "processor_timers_fired",
    "Due timers the timer scan turned into decisions",
    registry=REGISTRY,
)
TIMERS_DUE = Gauge(
    "processor_timers_due",
    "Timers due (at or before now) at the last scan, by partition (at most timer_batch)",
    ["partition"],
    registry=REGISTRY,
)
RESTORE_REMAINING = Gauge(
    "processor_restore_remaining_facts",
    "Offsets of runs.facts still to fold into a partition's store while it is restored "
    "(0 once caught up)",
    ["partition"],
    registry=REGISTRY,
)
RESTORE_FACTS = Counter(
    "processor_restore_facts",
    "Facts folded into partition stores by restores on assignment",
    registry=REGISTRY,
)


@dataclass(slots=True)
class TransactionTally:
    """What one transaction did, gathered while deciding and recorded once it commits."""

    inputs: int = 0
    started: list[str] = field(default_factory=list)  # pipelines
    finished: list[tuple[str, str, float]] = field(default_factory=list)  # pipeline, outcome, s
    rejected: list[str] = field(default_factory=list)  # reasons


class _Switch:
    on = True


_RECORDING = _Switch()


def set_recording(on: bool) -> None:
    """Record the per-transaction and per-step metrics (on by default), or not: a
    process that serves no /metrics (``--no-http``) skips the work."""
    _RECORDING.on = on


def recording() -> bool:
    """Whether the per-transaction and per-step metrics are recorded."""
    return _RECORDING.on


def observe_step(pipeline: str, step: str, seconds: float) -> None:
    """Record one step function's duration (in a worker)."""
    if _RECORDING.on:
        if _RELAYING.to is None:
            _step_histogram(pipeline, step).observe(seconds)
        else:
            _RELAYING.to.add("step_seconds", (pipeline, step), seconds)


@functools.lru_cache(maxsize=4096)
def _step_histogram(pipeline: str, step: str) -> Histogram:
    """The step duration histogram of one step (``labels`` costs a lock and a lookup)."""
    return STEP_SECONDS.labels(pipeline, step)


def count_deadline_warning(pipeline: str, step: str) -> None:
    """Count one deadline warning (recorded even when other metrics are off: it is rare)."""
    _worker_record("deadline_warnings", (pipeline, step), 1.0)


def count_worker_rejection(reason: str) -> None:
    """Count one input a worker refused to ``admission.rejected``."""
    _worker_record("rejected", (reason,), 1.0)


# --- a child process's worker metrics, recorded by its parent -----------------------------


class Relay:
    """Worker metrics recorded in a child process (``processor run``'s in-process workers),
    held until the child sends them to its parent, which records them in its registry
    (``apply_relayed``): the parent's ``/metrics`` shows them as before."""

    def __init__(self) -> None:
        self._held: deque[Relayed] = deque()

    def add(self, metric: str, labels: tuple[str, ...], value: float) -> None:
        self._held.append((metric, labels, value))  # thread-safe: any worker thread

    def take(self) -> list[Relayed]:
        """What was recorded since the last take."""
        taken = []
        while self._held:
            taken.append(self._held.popleft())
        return taken


#: One relayed observation: the metric's short name, its label values, the value.
Relayed = tuple[str, tuple[str, ...], float]


class _Relaying:
    to: Relay | None = None


_RELAYING = _Relaying()
#: The metrics a worker records, by their short name in a relay.
_WORKER_METRICS: dict[str, Histogram | Counter] = {
    "step_seconds": STEP_SECONDS,
    "deadline_warnings": STEP_DEADLINE_WARNINGS,
    "rejected": REJECTED,
}


def relay_to(relay: Relay | None) -> None:
    """Hold this process's worker metrics in ``relay`` instead of the registry (None:
    back to the registry)."""
    _RELAYING.to = relay


def apply_relayed(observations: Iterable[Relayed]) -> None:
    """Record in this registry what a child's relay held; unknown names are skipped."""
    for metric, labels, value in observations:
        family = _WORKER_METRICS.get(metric)
        if isinstance(family, Histogram):
            family.labels(*labels).observe(value)
        elif family is not None:
            family.labels(*labels).inc(value)


def _worker_record(metric: str, labels: tuple[str, ...], value: float) -> None:
    if _RELAYING.to is not None:
        _RELAYING.to.add(metric, labels, value)
        return
    family = _WORKER_METRICS[metric]
    assert isinstance(family, Counter)
    family.labels(*labels).inc(value)


def record_transaction(seconds: float, tally: TransactionTally) -> None:
    """Record one committed transaction (its latency and what it did)."""
    if not _RECORDING.on:
        return
    TRANSACTION_SECONDS.observe(seconds)
    TRANSACTION_INPUTS.observe(tally.inputs)
    _count(RUNS_STARTED, ((p,) for p in tally.started))
    _count(REJECTED, ((r,) for r in tally.rejected))
    if tally.finished:
        _count(RUNS_FINISHED, ((p, o) for p, o, _ in tally.finished))
        for pipeline, outcome, elapsed in tally.finished:
            RUN_SECONDS.labels(pipeline, outcome).observe(elapsed)


def _count(counter: Counter, labels: Iterable[Sequence[str]]) -> None:
    """Add up label tuples first: one ``inc`` per distinct label set, not per item."""
    for values, times in Tally(tuple(v) for v in labels).items():
        counter.labels(*values).inc(times)
