"""A worker: consumes segments.work, runs the steps, produces segments.results.

Workers are stateless and at-least-once. A result that arrives for an attempt
that is no longer current is refused by the processor, so duplicates are safe.
"""

from __future__ import annotations

import logging
import threading
import uuid

from processor.config.settings import default_of
from processor.errors import FactDecodeError, TransportError
from processor.facts.codec import codec, encode
from processor.facts.models import StopNotice, WorkItem
from processor.facts.rejection import rejected
from processor.facts.topics import TopicName
from processor.facts.traceparent import TRACEPARENT_HEADER, is_traceparent
from processor.telemetry import logs
from processor.telemetry.metrics import REJECTED
from processor.transport.base import GroupConsumer, Outbound, Producer, Record, Transport
from processor.transport.clock import Clock, wall_clock_ms
from processor.transport.topology import Topology
from processor.worker.announce import Announcer
from processor.worker.executor import execute
from processor.worker.pipeline import Application

__all__ = ["Worker"]

logger = logging.getLogger(__name__)


class Worker:
    """One worker consumer; run several (threads or processes) to scale out."""

    def __init__(
        self,
        transport: Transport,
        app: Application,
        topology: Topology,
        *,
        group: str = default_of("worker_group"),
        worker_id: str | None = None,
        max_batch: int = 10,
        clock: Clock = wall_clock_ms,
        max_payload_bytes: int = default_of("max_payload_bytes"),
        announce_interval_ms: int = default_of("worker_announce_interval_ms"),
    ) -> None:
        self._transport = transport
        self._app = app
        self._topology = topology
        self._group = group
        self.worker_id = worker_id or f"worker-{uuid.uuid4().hex[:8]}"
        self._max_batch = max_batch
        self._clock = clock
        self._max_payload_bytes = max_payload_bytes
        self.announcer = Announcer(
            app,
            topology,
            worker_id=self.worker_id,
            group=group,
            interval_ms=announce_interval_ms,
            clock=clock,
        )

    def run(self, stop: threading.Event) -> None:
        work_topic = self._topology.name(TopicName.WORK)
        consumer = self._transport.consumer(self._group, [work_topic])
        producer = self._transport.producer()
        announcing = threading.Event()
        announcer = threading.Thread(
            target=self.announcer.run,
            args=(self._transport.producer(), announcing),
            name=f"{self.worker_id}-announcer",
            daemon=True,
        )
        announcer.start()
        try:
            while not stop.is_set():
                try:
                    self._run_batch(consumer.poll(self._max_batch, 0.1), consumer, producer)
                except TransportError as exc:
                    logger.warning("%s: transport error, retrying: %s", self.worker_id, exc)
                    stop.wait(0.5)
        finally:
            announcing.set()  # it says the worker leaves
            announcer.join(10)
            consumer.close()
            producer.close()

    def _run_batch(
        self, records: list[Record], consumer: GroupConsumer, producer: Producer
    ) -> None:
        if not records:
            return
        for record in records:
            outbound = self._process(record)
            if outbound is not None:
                producer.produce(outbound)
        producer.flush()
        positions = {r.position: r.offset + 1 for r in records}
        consumer.commit(positions)

    def _process(self, record: Record) -> Outbound | None:
        try:
            item = codec().decode(record.value)
            if isinstance(item, StopNotice):
                return None  # for a running attempt; this worker runs one at a time
            if not isinstance(item, WorkItem):
                detail = f"expected WorkItem, got {type(item).__name__}"
                raise FactDecodeError("wrong_schema", detail, record.value)
        except FactDecodeError as exc:
            return self._rejected(record, exc)
        with logs.run_context(item.run_id, item.pipeline, item.first_step, item.attempt):
            return self._run(item, _traceparent(record))

    def _run(self, item: WorkItem, traceparent: str | None) -> Outbound | None:
        if item.expires_ms < self._clock():
            logger.info(
                "skipping expired attempt %s/%s of run %s", item.segment, item.attempt, item.run_id
            )
            return None
        result = execute(item, self._app, self.worker_id, traceparent, self._max_payload_bytes)
        # The result carries the run's traceparent on, like the work item it answers.
        headers = () if traceparent is None else ((TRACEPARENT_HEADER, traceparent.encode()),)
        return Outbound(
            self._topology.name(TopicName.RESULTS), item.run_id.encode(), encode(result), headers
        )

    def _rejected(self, record: Record, exc: FactDecodeError) -> Outbound:
        REJECTED.labels(exc.reason).inc()
        refusal = rejected(record, exc.reason, exc.detail, self._clock())
        return Outbound(self._topology.name(TopicName.REJECTED), record.key or b"", encode(refusal))


def _traceparent(record: Record) -> str | None:
    """The work item's ``traceparent`` header, if it has a valid one."""
    for name, value in reversed(record.headers):
        if name == TRACEPARENT_HEADER:
            text = value.decode("ascii", errors="replace")
            return text if is_traceparent(text) else None
    return None
