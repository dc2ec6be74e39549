"""A worker: consumes segments.work, runs the steps, produces segments.results.

Workers are stateless and at-least-once. A result that arrives for an attempt
that is no longer current is refused by the processor, so duplicates are safe.

A worker runs up to ``concurrency`` attempts at once: ``async def`` steps on an
event loop, sync steps on a pool of ``concurrency`` threads. It polls no more work
items than it has free slots, and commits a partition's offset only up to its oldest
unfinished record, so a crash redelivers every attempt that had not finished.
A slot frees when its attempt ends; the result is produced after that, and its
record is finished once the result is flushed.
An attempt that must not run twice (``PipelineSpec.needs_claim``: an effectful
segment, or the compensator of an effectful step) runs only once its claim is
granted (``model.claims``); a refused one is not run. A work item of an attempt
already stopped or given up as lost (a stop notice read before it starts) is not run
either; otherwise an attempt whose timer ran out while the item was queued is run
anyway, and its result refused by the processor if it is stale. Stop notices and
the answers to claims come apart from the work, on segments.control
(``ControlListener``), so they reach an attempt however much work is queued in front
of it.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import Future
from typing import TYPE_CHECKING

from processor.config.settings import default_of
from processor.errors import FactDecodeError, FencedError, TransportError
from processor.facts.codec import codec, encode
from processor.facts.models import ClaimReply, SegmentResult, StopNotice, WorkItem
from processor.facts.rejection import rejected
from processor.facts.topics import TopicName
from processor.facts.traceparent import TRACEPARENT_HEADER, is_traceparent
from processor.model import claims
from processor.model.stop_notices import LOST
from processor.telemetry import logs
from processor.telemetry.metrics import count_worker_rejection
from processor.transport.base import GroupConsumer, Outbound, Record, TopicPartition, Transport
from processor.transport.clock import Clock, wall_clock_ms
from processor.transport.membership import join_until_stopped
from processor.transport.topology import Topology
from processor.worker.announce import Announcer
from processor.worker.attempts import RUNNING, RunningAttempt
from processor.worker.control import LISTENERS, ControlListener
from processor.worker.executor import execute, execute_async, needs_loop, not_run
from processor.worker.joining import JoinGate
from processor.worker.offsets import PendingOffsets
from processor.worker.outbox import Outbox
from processor.worker.pipeline import Application
from processor.worker.progress import ProducedProgress
from processor.worker.runtime import StepRuntime

if TYPE_CHECKING:
    from processor.transport.deployment import Deployment

__all__ = ["Worker"]

logger = logging.getLogger(__name__)

_POLL_S = 0.1  # how long a poll waits for records: also the period of the attempt checks


class Worker:
    """One worker consumer running up to ``concurrency`` attempts at once; run several
    (threads or processes) to scale out."""

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
        concurrency: int = default_of("worker_concurrency"),
        start_report_after_ms: int = default_of("start_report_after_ms"),
        drain_timeout_s: float = 10.0,
        static_member: bool = False,
        announce_interval_ms: int = default_of("worker_announce_interval_ms"),
        gate: JoinGate | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self._transport = transport
        self._app = app
        self._topology = topology
        self._group = group
        self.worker_id = worker_id or f"worker-{uuid.uuid4().hex[:8]}"
        self._max_batch = max_batch
        self._clock = clock
        self._max_payload_bytes = max_payload_bytes
        self.concurrency = concurrency
        self._start_report_after_ms = start_report_after_ms
        self._drain_timeout_s = drain_timeout_s
        self._results = topology.name(TopicName.RESULTS)
        self._offsets = PendingOffsets()
        self._running: dict[_Slot, RunningAttempt] = {}  # the slots in use
        self._unflushed = 0  # results of ended attempts not flushed yet
        self._lock = threading.Lock()
        # A static member (a stable ``worker_id``): back after a crash, it gets at once
        # the work items it held (processor run's in-process workers).
        self._instance_id = self.worker_id if static_member else None
        self._freed = threading.Event()
        #: Set once the worker has taken its place in its group (``GroupConsumer.joined``).
        self.joined = threading.Event()
        # The workers of this process that start their work together (``joining``), and
        # whether this one still holds its consumer for them.
        self._gate = gate
        self._holding = False
        self._stops: ControlListener | None = None  # while it runs: its process's listener
        self.reporter_id = self.worker_id  # the id progress reports carry (set by run)
        self.announcer = Announcer(
            app,
            topology,
            worker_id=self.worker_id,
            group=group,
            concurrency=concurrency,
            interval_ms=announce_interval_ms,
            clock=clock,
        )

    @classmethod
    def from_settings(
        cls,
        deployment: Deployment,
        app: Application,
        *,
        concurrency: int | None = None,
        worker_id: str | None = None,
        static_member: bool = False,
        clock: Clock = wall_clock_ms,
        gate: JoinGate | None = None,
    ) -> Worker:
        """A worker of ``app`` as ``deployment``'s settings configure it.

        ``concurrency`` overrides the setting (a command-line option); ``processor
        run``'s in-process workers also give their ``worker_id``, as ``static_member``s,
        and the processor's ``clock``; the workers of one process share a ``gate``.
        """
        settings = deployment.settings
        return cls(
            deployment.transport,
            app,
            deployment.topology,
            group=settings.worker_group,
            worker_id=worker_id,
            static_member=static_member,
            clock=clock,
            max_payload_bytes=settings.max_payload_bytes,
            concurrency=concurrency or settings.worker_concurrency,
            start_report_after_ms=settings.start_report_after_ms,
            announce_interval_ms=settings.worker_announce_interval_ms,
            gate=gate,
        )

    @property
    def stops(self) -> ControlListener:
        """The stop listener this worker uses while it runs."""
        assert self._stops is not None, "the worker is not running"
        return self._stops

    @property
    def taken(self) -> int:
        """Work items this worker runs now."""
        with self._lock:
            return len(self._running)

    def run(self, stop: threading.Event) -> None:
        work_topic = self._topology.name(TopicName.WORK)
        outbox = Outbox(self._transport.producer, self.worker_id)
        outbox.start()
        runtime = StepRuntime(self.concurrency, self.worker_id)
        # Progress names this life of the worker: a static member back after a crash
        # starts its attempts again, and the processor must see them started anew.
        self.reporter_id = f"{self.worker_id}/{uuid.uuid4().hex[:8]}"
        progress = ProducedProgress(outbox.send, self._results, self.reporter_id)
        try:
            consumer = self._group_consumer(work_topic, stop)
        except BaseException:
            outbox.close()
            raise
        if consumer is None:  # stopped before the log could be reached
            outbox.close()
            return
        if self._gate is not None:
            consumer.hold(True)  # until every worker of the gate has joined
            self._holding = True
        announcing = threading.Event()
        announcer = threading.Thread(
            target=self.announcer.run,
            args=(self._transport.producer(), announcing),
            name=f"{self.worker_id}-announcer",
            daemon=True,
        )
        announcer.start()
        self._stops = LISTENERS.join(self._transport, self._topology, self.worker_id)
        try:
            while not stop.is_set():
                try:
                    self._round(consumer, outbox, runtime, progress)
                except FencedError as exc:
                    rejoined = self._rejoin(consumer, work_topic, stop, exc)
                    if rejoined is None:
                        break
                    consumer = rejoined
                except TransportError as exc:
                    logger.warning("%s: transport error, retrying: %s", self.worker_id, exc)
                    stop.wait(0.5)
        finally:
            self._drain(consumer)
            announcing.set()  # it says the worker leaves
            announcer.join(10)
            LISTENERS.leave(self._stops)
            outbox.close()
            runtime.close()
            consumer.close()

    def _rejoin(
        self, dead: GroupConsumer, topic: str, stop: threading.Event, why: FencedError
    ) -> GroupConsumer | None:
        """A new member for one the group no longer knows (a broker outage can leave a
        static member's place to its own next join, which fences the old one for good).
        Attempts running go on; their items, delivered again, are recognized as running
        here (``_runs_already``). None when stopped meanwhile."""
        logger.warning("%s: its consumer is dead, joining the group again: %s", self.worker_id, why)
        dead.close()
        consumer = self._group_consumer(topic, stop)
        if consumer is not None and self._holding:
            consumer.hold(True)
        return consumer

    def _group_consumer(self, topic: str, stop: threading.Event) -> GroupConsumer | None:
        """The worker's member of its group, once the log can be reached; None if
        ``stop`` came first."""
        return join_until_stopped(
            self._transport,
            self._group,
            [topic],
            stop,
            who=self.worker_id,
            instance_id=self._instance_id,
        )

    # --- one round of the loop -------------------------------------------------------------

    def _round(
        self,
        consumer: GroupConsumer,
        outbox: Outbox,
        runtime: StepRuntime,
        progress: ProducedProgress,
    ) -> None:
        """Poll for what fits in the free slots and start it, check the running
        attempts, commit the offsets below the oldest unfinished record."""
        self._pass_the_gate(consumer)
        free = self._free()
        if free > 0:
            records = consumer.poll(min(self._max_batch, free), _POLL_S)
        else:
            records = []
            self._freed.wait(_POLL_S)
        self._freed.clear()
        for record in records:
            self._take(record, outbox, runtime, progress)
        now = self._clock()
        for attempt in self._attempts():
            attempt.check(now)
        self._commit(consumer)

    def _pass_the_gate(self, consumer: GroupConsumer) -> None:
        """Note the join (once); take work once every worker of the gate has joined."""
        if not self.joined.is_set() and consumer.joined():
            self.joined.set()
            if self._gate is not None:
                self._gate.joined()
        if self._holding and self._gate is not None and self._gate.opened.is_set():
            consumer.hold(False)
            self._holding = False

    def _free(self) -> int:
        """Slots free for a new attempt. Ended attempts whose results wait to be flushed
        take no slot, up to ``concurrency`` of them (then the worker waits for the
        producer, instead of piling up results it cannot send)."""
        with self._lock:
            running = len(self._running)
            return max(
                0, min(self.concurrency - running, 2 * self.concurrency - running - self._unflushed)
            )

    def _busy(self) -> bool:
        """Whether an attempt runs, or an ended one's result is not flushed yet."""
        with self._lock:
            return bool(self._running) or self._unflushed > 0

    def _attempts(self) -> list[RunningAttempt]:
        with self._lock:
            return list(self._running.values())

    def _take(
        self,
        record: Record,
        outbox: Outbox,
        runtime: StepRuntime,
        progress: ProducedProgress,
    ) -> None:
        """Start a work item, apply a stop notice, or refuse what is neither."""
        self._offsets.taken(record)
        try:
            message = codec().decode(record.value)
        except FactDecodeError as exc:
            outbox.send(self._rejected(record, exc), lambda: self._offsets.finished(record))
            return
        if isinstance(message, WorkItem):  # polled for a free slot: it starts at once
            self._start(record, message, outbox, runtime, progress)
            return
        if isinstance(message, StopNotice):  # where processors before segments.control sent it
            self.stops.apply(message)
            self._offsets.finished(record)
            return
        wrong = FactDecodeError(
            "wrong_schema",
            f"expected WorkItem or StopNotice, got {type(message).__name__}",
            record.value,
        )
        outbox.send(self._rejected(record, wrong), lambda: self._offsets.finished(record))

    # --- attempts --------------------------------------------------------------------------

    def _start(
        self,
        record: Record,
        item: WorkItem,
        outbox: Outbox,
        runtime: StepRuntime,
        progress: ProducedProgress,
    ) -> None:
        """Run the item's attempt in a free slot: at once, once its claim is granted, or
        not at all (it runs here already; it was stopped or lost before it started)."""
        attempt = RunningAttempt(item, progress, self._clock, self._start_report_after_ms)
        if self._runs_already(record, attempt):
            return
        notice = self.stops.notice_for(attempt.ref)  # read before the attempt started
        with self._lock:
            self._running[_slot(record)] = attempt
        RUNNING.add(attempt)
        if notice is not None:
            self._not_run(record, attempt, notice.reason, f"stop notice ({notice.reason})", outbox)
            return
        spec = self._app.get(item.pipeline, item.pipeline_version)
        if spec is not None and spec.needs_claim(item.kind, item.first_step):
            attempt.claim(lambda reply: self._claimed(record, attempt, reply, outbox, runtime))
            return
        self._run(record, attempt, outbox, runtime)

    def _runs_already(self, record: Record, attempt: RunningAttempt) -> bool:
        """Whether this worker runs the attempt already: its work item delivered again
        (a partition taken away and given back). The attempt that runs finishes the
        item's record (the same one); another record of it is finished now."""
        with self._lock:
            if all(running.ref != attempt.ref for running in self._running.values()):
                return False
            same = _slot(record) in self._running
        logger.info(
            "%s: attempt %s of run %s delivered again while it runs here",
            self.worker_id,
            attempt.item.attempt,
            attempt.item.run_id,
        )
        if not same:
            self._offsets.finished(record)
        return True

    def _claimed(
        self,
        record: Record,
        attempt: RunningAttempt,
        reply: ClaimReply,
        outbox: Outbox,
        runtime: StepRuntime,
    ) -> None:
        """The processor's answer to the attempt's claim: run it, or not."""
        if reply.granted:
            self._run(record, attempt, outbox, runtime)
            return
        reason = reply.reason or "refused"
        self._not_run(record, attempt, reason, f"claim refused: {reason} ({reply.detail})", outbox)

    def _not_run(
        self, record: Record, attempt: RunningAttempt, reason: str, why: str, outbox: Outbox
    ) -> None:
        """End an attempt without running it. A run that is stopping waits for its
        attempt's result: it gets a failed one; anything else needs none (the attempt
        was lost, is claimed by another worker, or is no longer open)."""
        item = attempt.item
        logger.warning(
            "%s: attempt %s of run %s not run: %s",
            self.worker_id,
            item.attempt,
            item.run_id,
            why,
            extra=logs.run_extra(item.run_id, item.pipeline, item.first_step, item.attempt),
        )
        stopping = reason not in _NO_RESULT
        result = not_run(item, self.worker_id, why) if stopping else None
        self._ended(record, attempt, _traceparent(record), result, outbox)
        if result is None:
            self._offsets.finished(record)

    def _run(
        self, record: Record, attempt: RunningAttempt, outbox: Outbox, runtime: StepRuntime
    ) -> None:
        traceparent = _traceparent(record)
        future = self._submit(attempt.item, attempt, traceparent, runtime)
        future.add_done_callback(
            lambda done: self._ended(
                record, attempt, traceparent, _result_of(done, attempt), outbox
            )
        )

    def _submit(
        self,
        item: WorkItem,
        attempt: RunningAttempt,
        traceparent: str | None,
        runtime: StepRuntime,
    ) -> Future[SegmentResult]:
        if needs_loop(item, self._app):
            return runtime.run_async(
                execute_async(
                    item,
                    self._app,
                    self.worker_id,
                    runtime.in_pool,
                    traceparent=traceparent,
                    max_payload_bytes=self._max_payload_bytes,
                    attempt=attempt,
                )
            )

        def run() -> SegmentResult:
            with logs.run_context(item.run_id, item.pipeline, item.first_step, item.attempt):
                return execute(
                    item,
                    self._app,
                    self.worker_id,
                    traceparent,
                    self._max_payload_bytes,
                    attempt=attempt,
                )

        return runtime.run_sync(run)

    def _ended(
        self,
        record: Record,
        attempt: RunningAttempt,
        traceparent: str | None,
        result: SegmentResult | None,
        outbox: Outbox,
    ) -> None:
        """Free the attempt's slot and produce its result; its offset is finished once
        the result is flushed (without a result, by the caller)."""
        RUNNING.remove(attempt)
        with self._lock:
            self._running.pop(_slot(record), None)
            self._unflushed += result is not None
        self._freed.set()
        if result is None:
            return
        # The result carries the run's traceparent on, like the work item it answers.
        headers = () if traceparent is None else ((TRACEPARENT_HEADER, traceparent.encode()),)
        outbound = Outbound(self._results, result.run_id.encode(), encode(result), headers)
        outbox.send(outbound, lambda: self._flushed(record))

    def _flushed(self, record: Record) -> None:
        self._offsets.finished(record)
        with self._lock:
            self._unflushed -= 1
        self._freed.set()

    # --- offsets ---------------------------------------------------------------------------

    def _commit(self, consumer: GroupConsumer, *, last: bool = False) -> None:
        """Commit the positions that moved, without waiting for the broker (a loop round
        is not held up by a round trip); the ``last`` one, at stop, waits (and closing
        the consumer waits for the commits still on their way). A failed commit is not
        retried as such (a revoked partition's would fail forever): the next position
        that moves is committed, and at worst finished items are delivered again."""
        positions = self._offsets.committable()
        if not positions:
            return
        try:
            if last:
                consumer.commit(positions)
            else:
                consumer.commit_soon(positions)
        except TransportError as exc:
            logger.warning("%s: commit failed, delivered again at worst: %s", self.worker_id, exc)
        self._offsets.committed(positions)

    def _drain(self, consumer: GroupConsumer) -> None:
        """At stop: let running attempts finish and their results flush (up to the drain
        timeout), commit."""
        deadline = time.monotonic() + self._drain_timeout_s
        while self._busy() and time.monotonic() < deadline:
            self._freed.wait(_POLL_S)
            self._freed.clear()
        with self._lock:
            running = len(self._running)
        if running:
            logger.warning(
                "%s: stopping with %d attempts still running (delivered again later)",
                self.worker_id,
                running,
            )
        self._commit(consumer, last=True)

    def _rejected(self, record: Record, exc: FactDecodeError) -> Outbound:
        count_worker_rejection(exc.reason)
        refusal = rejected(record, exc.reason, exc.detail, self._clock())
        return Outbound(self._topology.name(TopicName.REJECTED), record.key or b"", encode(refusal))


_Slot = tuple[TopicPartition, int]
#: Why an attempt is not run, when the processor waits for no result of it: it was
#: lost (another attempt runs), or its claim was refused so (``claims.WITHOUT_RESULT``).
_NO_RESULT = claims.WITHOUT_RESULT | {LOST}


def _slot(record: Record) -> _Slot:
    return record.position, record.offset


def _result_of(done: Future[SegmentResult], attempt: RunningAttempt) -> SegmentResult | None:
    """The attempt's result; None if the worker stopped before it ended, or it crashed
    (a bug in the executor, not a step's failure): its offset stays unfinished."""
    if done.cancelled():
        return None
    failure = done.exception()
    if failure is not None:
        logger.error("attempt of run %s crashed", attempt.item.run_id, exc_info=failure)
        return None
    return done.result()


def _traceparent(record: Record) -> str | None:
    """The work item's ``traceparent`` header, if it has a valid one."""
    for name, value in reversed(record.headers):
        if name == TRACEPARENT_HEADER:
            text = value.decode("ascii", errors="replace")
            return text if is_traceparent(text) else None
    return None
