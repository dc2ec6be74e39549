"""Gauges computed when /metrics is scraped, from a running processor loop.

Lags compare what the loop has committed (its input positions, the runs.facts
position its stores have applied: plain dicts it updates once per transaction)
with the ends of the partitions, read here with a reader of our own. Nothing
here runs on the loop's thread or touches its stores.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from processor.engine.loop import ProcessorLoop
from processor.errors import TransportError
from processor.facts.topics import TopicName
from processor.transport.base import Reader, TopicPartition
from processor.transport.topology import Topology

__all__ = ["CensusCollector", "LoopCollector", "processor_collectors"]

logger = logging.getLogger(__name__)


class LoopCollector(Collector):
    """Consumer lag, projection lag and restore state of the loop ``current()`` returns."""

    def __init__(
        self, current: Callable[[], ProcessorLoop | None], reader: Reader, topology: Topology
    ) -> None:
        self._current = current
        self._reader = reader
        self._facts_topic = topology.name(TopicName.FACTS)
        self._lock = threading.Lock()  # one scrape at a time uses the reader

    def collect(self) -> Iterator[GaugeMetricFamily]:
        loop = self._current()
        consumer = GaugeMetricFamily(
            "processor_consumer_lag",
            "Records of an input partition after the position the processor committed",
            labels=["topic", "partition"],
        )
        projection = GaugeMetricFamily(
            "processor_projection_lag_facts",
            "Offsets of runs.facts not yet applied to the partition's store",
            labels=["partition"],
        )
        owned = GaugeMetricFamily(
            "processor_partitions_owned", "Partitions this processor owns (caught up or not)"
        )
        restoring = GaugeMetricFamily(
            "processor_partitions_restoring",
            "Partitions being restored or caught up (the processor is not ready meanwhile)",
        )
        workers = GaugeMetricFamily(
            "processor_live_workers",
            "Workers this processor has heard announce themselves and not yet lost",
        )
        if loop is not None:
            with self._lock:
                self._lags(loop, consumer, projection)
            owned.add_metric([], len(loop.owned_partitions))
            restoring.add_metric([], len(loop.restoring))
            workers.add_metric([], len(loop.fleet.workers))
        yield from (consumer, projection, owned, restoring, workers)

    def _lags(
        self, loop: ProcessorLoop, consumer: GaugeMetricFamily, projection: GaugeMetricFamily
    ) -> None:
        try:
            for tp, position in sorted(dict(loop.input_positions).items()):
                lag = self._reader.end_offset(tp) - position
                consumer.add_metric([tp.topic, str(tp.partition)], max(0, lag))
            for partition, applied in sorted(dict(loop.applied_facts).items()):
                end = self._reader.end_offset(TopicPartition(self._facts_topic, partition))
                projection.add_metric([str(partition)], max(0, end - applied))
        except TransportError as exc:  # a scrape without lags beats a failed scrape
            logger.warning("metrics: partition ends unknown: %s", exc)

    def close(self) -> None:
        with self._lock:
            self._reader.close()


class CensusCollector(Collector):
    """Runs waiting at a boundary by target, open Unknown attempts, runs blocked on a
    pipeline version and runs in quarantine (or skipped), from the counts the loop keeps
    for its partitions (``store/census.py``): a scrape reads no store."""

    def __init__(self, current: Callable[[], ProcessorLoop | None]) -> None:
        self._current = current

    def collect(self) -> Iterator[GaugeMetricFamily]:
        waiting = GaugeMetricFamily(
            "processor_runs_waiting",
            "Runs with an open interaction at a boundary, by target",
            labels=["target"],
        )
        unknown = GaugeMetricFamily(
            "processor_unknown_attempts",
            "Runs whose attempt's outcome is unknown: waiting for an operator (processor resolve)",
        )
        blocked = GaugeMetricFamily(
            "processor_runs_definition_blocked",
            "Runs waiting for a live worker that loads their pinned version, by version",
            labels=["pipeline", "version"],
        )
        held = GaugeMetricFamily(
            "processor_runs_quarantined",
            "Runs in quarantine: a decision about them raised (processor release); "
            "skipped: not even their quarantine could be recorded (until a restart)",
            labels=["state"],
        )
        targets: Counter[str] = Counter()
        versions: Counter[tuple[str, int]] = Counter()
        open_unknown = quarantined = 0
        loop = self._current()
        for census in [] if loop is None else list(loop.census.values()):
            by_target, count = census.snapshot()
            targets.update(by_target)
            open_unknown += count
            versions.update(census.blocked())
            quarantined += len(census.quarantined())
        for target, count in sorted(targets.items()):
            waiting.add_metric([target], count)
        unknown.add_metric([], open_unknown)
        for (pipeline, version), count in sorted(versions.items()):
            blocked.add_metric([pipeline, str(version)], count)
        held.add_metric(["quarantined"], quarantined)
        held.add_metric(["skipped"], 0 if loop is None else len(loop.skipped_runs))
        yield from (waiting, unknown, blocked, held)


def processor_collectors(
    current: Callable[[], ProcessorLoop | None], reader: Reader, topology: Topology
) -> tuple[LoopCollector, CensusCollector]:
    """The scrape-time gauges of a processor (its HTTP server registers them while it
    serves): every metric they describe is in README.md's table, as a test checks."""
    return LoopCollector(current, reader, topology), CensusCollector(current)
