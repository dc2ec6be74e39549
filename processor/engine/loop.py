"""The processor loop: the one place that orders effects.

Each iteration polls a batch of run-addressed inputs, decides (pure) against the
staged projections as each input's entry in ``engine/inputs.py`` says, scans due
timers, then commits once:

1. produce facts, outbound messages and terminal publications inside one log
   transaction,
2. commit it together with the consumed input offsets,
3. apply the facts to RocksDB in one WriteBatch with the facts offset.

A crash between 2 and 3 is repaired on start by catching up from runs.facts
(``restore/assignment.py``, when partitions are assigned); a crash before 2 leaves
nothing behind, and the inputs are processed again.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from processor.admission.admit import admit
from processor.admission.arrivals import Refusal
from processor.admission.signals import NO_MATCHING_WAIT, KeyedEvent
from processor.config.settings import Settings
from processor.engine import fact_records
from processor.engine.fleet import Fleet
from processor.engine.inline import InlineSegment, InlineSteps
from processor.engine.inputs import INPUTS, ByKey, FleetNews
from processor.engine.spans import Traced, record_spans
from processor.errors import (
    AppendConflictError,
    FactDecodeError,
    FencedError,
    SessionLostError,
    TransportError,
)
from processor.facts import json_wire
from processor.facts.codec import encode
from processor.facts.keyring import KeyRing
from processor.facts.models import AvroModel, BoundaryRequest, RunSubmitted, SegmentResult
from processor.facts.rejection import rejected
from processor.facts.topics import RUN_ADDRESSED_INPUTS, TopicName
from processor.facts.traceparent import TRACEPARENT_HEADER
from processor.model import quarantine
from processor.model.decide import (
    Context,
    Decision,
    Emit,
    PipelineCatalog,
    Publish,
    TimerFired,
    decide_timer,
    decide_unblock,
)
from processor.model.decision import LiveVersions
from processor.model.state import RunState
from processor.restore.assignment import RestoreConfig, restore_assigned
from processor.store.census import RunCensus, blocked_runs
from processor.store.event_index import candidates, waits_on
from processor.store.staging import Staging
from processor.telemetry import logs, metrics, tracing
from processor.transport.base import (
    Headers,
    Outbound,
    ProcessorSession,
    Record,
    TopicPartition,
    Transport,
)
from processor.transport.clock import Clock, wall_clock_ms
from processor.transport.partitioner import partition_for
from processor.transport.topology import Topology

__all__ = ["LoopConfig", "OnOwned", "ProcessorLoop"]

logger = logging.getLogger(__name__)

INTERNAL_ERROR = "internal_error"
_MAX_DETAIL = 2000  # characters of an exception's text kept in a rejection
#: Told the partitions a loop owns and the partition count, each time they change.
OnOwned = Callable[[list[int], int], None]
#: What carries the run's traceparent as a header: what workers and the outside read.
TRACED_TOPICS = frozenset({TopicName.WORK, TopicName.REQUESTS, TopicName.OUTCOMES, TopicName.DLQ})


@dataclass(frozen=True, slots=True)
class LoopConfig:
    """What the loop needs of the settings; no defaults: ``from_settings`` builds it."""

    state_dir: Path
    group: str
    instance_id: str
    max_batch: int
    poll_timeout_s: float
    timer_interval_ms: int
    timer_batch: int
    keep_runs: int
    resume_keys: KeyRing
    stable_wait_s: float
    # A restore of this many facts or more, of several partitions, runs in processes.
    parallel_restore_min_facts: int
    # Restore folds with the compiled fold when it is installed (store/native_fold.py).
    native_fold: bool
    # The largest run input or completion payload admitted (payload_too_large beyond).
    max_payload_bytes: int
    # Attempts a run may lose to the infrastructure before a loss counts as a failure.
    max_infrastructure_losses: int
    # How often workers announce themselves (engine/fleet.py: expiry and warm-up).
    announce_interval_ms: int
    # Topics any pipeline's steps may emit to (PROCESSOR_EMIT_TOPICS; model/emission.py).
    emit_topics: frozenset[str] = frozenset()
    # A run's facts of one transaction leave as one record (PROCESSOR_FACT_BATCHES).
    fact_batches: bool = False

    @staticmethod
    def from_settings(settings: Settings, *, instance_id: str, resume_keys: KeyRing) -> LoopConfig:
        """The loop's configuration: ``settings`` plus the claimed id and the resume keys."""
        return LoopConfig(
            state_dir=settings.state_dir,
            group=settings.group,
            instance_id=instance_id,
            max_batch=settings.max_batch,
            poll_timeout_s=settings.poll_timeout_ms / 1000,
            timer_interval_ms=settings.timer_interval_ms,
            timer_batch=settings.timer_batch,
            keep_runs=settings.keep_runs,
            resume_keys=resume_keys,
            stable_wait_s=settings.stable_wait_ms / 1000,
            parallel_restore_min_facts=settings.parallel_restore_min_facts,
            native_fold=settings.native_fold,
            max_payload_bytes=settings.max_payload_bytes,
            max_infrastructure_losses=settings.max_infrastructure_losses,
            announce_interval_ms=settings.worker_announce_interval_ms,
            emit_topics=frozenset(settings.declared_emit_topics),
            fact_batches=settings.fact_batches,
        )

    @property
    def restore(self) -> RestoreConfig:
        """What a restore of assigned partitions needs of it (``restore/assignment.py``)."""
        return RestoreConfig(
            state_dir=self.state_dir,
            stable_wait_s=self.stable_wait_s,
            parallel_min_facts=self.parallel_restore_min_facts,
            native_fold=self.native_fold,
            keep_runs=self.keep_runs,
        )


@dataclass
class _Batch:
    """Everything decided since the last commit."""

    outbound: list[Outbound] = field(default_factory=list)
    consumed: dict[TopicPartition, int] = field(default_factory=dict)
    effects: list[Outbound] = field(default_factory=list)  # terminal publications
    traced: list[Traced] = field(default_factory=list)  # only while spans are on
    inline: list[InlineSegment] = field(default_factory=list)  # work items to run here
    here: list[Record] = field(default_factory=list)  # inputs for runs of this loop (_here)
    finished: list[RunState] = field(default_factory=list)  # runs that became terminal
    tally: metrics.TransactionTally = field(default_factory=metrics.TransactionTally)

    def __bool__(self) -> bool:
        return bool(self.outbound or self.consumed or self.effects)


class ProcessorLoop:
    """Drives runs: consumes commands and results, fires timers, commits facts."""

    def __init__(
        self,
        transport: Transport,
        catalog: PipelineCatalog,
        topology: Topology,
        config: LoopConfig,
        clock: Clock = wall_clock_ms,
        *,
        on_owned: OnOwned | None = None,
        inline: InlineSteps | None = None,
    ) -> None:
        """``on_owned(partitions, partition_count)`` is told the partitions whose stores
        this loop has caught up and writes, each time they change (``Host``: for the
        readers of the state directory, ``store/ownership.py``). ``inline``: the work
        items this loop runs itself before it commits (``engine/inline.py``)."""
        self._transport = transport
        self._inline = inline
        self._on_owned = on_owned
        self._catalog = catalog
        self._topology = topology
        self._config = config
        self._clock = clock
        self._inputs = {topology.name(t): t for t in RUN_ADDRESSED_INPUTS}
        self._facts_topic = topology.name(TopicName.FACTS)
        self._results_topic = topology.name(TopicName.RESULTS)
        self._completions_topic = topology.name(TopicName.COMPLETIONS)
        self._stagings: dict[int, Staging] = {}
        self._partitions = topology.partitions
        self._reader = transport.reader()
        self._session: ProcessorSession | None = None
        self._batch = _Batch()
        # The live workers (not durable) and what they load, as of this round.
        self.fleet = Fleet(config.announce_interval_ms)
        self._live = self._live_versions()
        self._next_timer_scan = (
            0.0  # monotonic seconds: the tick is wall time, due times use the clock
        )
        # When the earliest timer known to be still to come is due (monotonic seconds;
        # inf: none known): the loop scans then too, and its poll waits no longer.
        self._next_due = math.inf
        self._timers_held = False
        self.committed_batches = 0
        # Read by the HTTP server's threads (whole values are swapped or updated in
        # place under the GIL): the partitions being restored, the input positions
        # committed, and the runs.facts position each store has applied.
        self.restoring: frozenset[int] = frozenset()
        self.input_positions: dict[TopicPartition, int] = {}
        self.applied_facts: dict[int, int] = {}
        # Each owned partition's runs waiting by target and Unknown attempts (metrics).
        self.census: dict[int, RunCensus] = {}
        # Runs whose decision raised and whose quarantine could not be recorded either
        # (the fold itself is broken): left alone until this process restarts.
        self.skipped_runs: set[str] = set()
        # A Kafka transaction ends with a commit marker at the offset after its last
        # record: the end of a runs.facts partition we alone write is one past that.
        self._marker = 1 if transport.name == "kafka" else 0

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self._partitions = self._topology.check_co_partitioning(
            self._transport.admin().describe_topics()
        )
        self._join()

    def _join(self) -> None:
        session = self._transport.session(self._config.group, self._config.instance_id)
        try:
            session.subscribe(list(self._inputs), self._on_assign, self._on_revoke)
        except BaseException:
            _close_quietly(session)
            raise
        self._session = session

    def run(self, stop: threading.Event) -> None:
        """Loop until ``stop`` is set, then close cleanly."""
        self.start()
        try:
            while not stop.is_set():
                self.run_once()
        finally:
            self.close()

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
        for staging in self._stagings.values():
            staging.store.close()
        self._stagings.clear()
        self._owned_changed()
        self.census.clear()
        self._reader.close()

    @property
    def owned_partitions(self) -> list[int]:
        return sorted(self._stagings)

    def hold_timers(self, held: bool) -> None:
        """Pause (or resume) the due-timer scan while inputs keep being processed.

        Operators may hold timers during a controlled maintenance; tests use it to
        decide an input before a timer that is already due.
        """
        self._timers_held = held
        self._next_timer_scan = math.inf if held else 0.0

    def run_state(self, run_id: str) -> RunState | None:
        """The committed projection of a run this instance owns (None if not ours or unknown)."""
        staging = self._stagings.get(partition_for(run_id.encode(), self._partitions))
        return None if staging is None else staging.store.run(run_id)

    # --- rebalance -----------------------------------------------------------------------

    def _on_assign(self, assigned: Sequence[TopicPartition]) -> None:
        partitions = sorted({tp.partition for tp in assigned} - set(self._stagings))
        self.restoring = frozenset(partitions)  # not ready until every one is caught up
        try:
            self._restore(partitions)
        finally:
            self.restoring = frozenset()
            self._owned_changed()
        if self._session is not None:
            self.input_positions.update(self._session.committed_positions())
        self.fleet.changed()  # their blocked runs may find a worker now

    def _restore(self, partitions: list[int]) -> None:
        """Take the stores of ``partitions``, caught up (``restore/assignment.py``)."""
        opened: dict[int, Staging] = {}
        restored = restore_assigned(
            self._transport, self._reader, self._facts_topic, self._config.restore, partitions
        )
        try:
            for caught_up in restored:
                self.applied_facts[caught_up.partition] = caught_up.applied
                self.census[caught_up.partition] = caught_up.census
                opened[caught_up.partition] = caught_up.staging
        finally:
            # All at once, so that ``owned_partitions`` (read by other threads) shows the
            # whole assignment; on a failure, the caught-up ones are closed with the rest.
            self._stagings.update(opened)

    def _on_revoke(self, revoked: Sequence[TopicPartition]) -> None:
        for partition in sorted({tp.partition for tp in revoked}):
            staging = self._stagings.pop(partition, None)
            if staging is not None:
                staging.discard()
                staging.store.close()
                self.applied_facts.pop(partition, None)
                self.census.pop(partition, None)
                logger.info("partition %d: revoked, store closed", partition)
        gone = {tp.partition for tp in revoked}
        for tp in [tp for tp in self.input_positions if tp.partition in gone]:
            del self.input_positions[tp]
        self._owned_changed()

    def _owned_changed(self) -> None:
        if self._on_owned is not None:
            self._on_owned(self.owned_partitions, self._partitions)

    # --- one iteration -------------------------------------------------------------------

    def run_once(self) -> int:
        """Poll, decide, fire timers and commit once; return the inputs handled.

        Nothing is decided before the poll: a rebalance runs its callbacks inside it,
        replacing the stores of the partitions it revokes and assigns, and a decision
        taken on a revoked store would be committed without reaching the new one.
        """
        if self._session is None:
            self._join()
        assert self._session is not None
        records = self._session.poll(self._config.max_batch, self._poll_timeout_s())
        now = self._clock()
        self._wake_blocked(now)
        for record in records:
            self._handle(record, now)
        scan = time.monotonic()
        if scan >= self._next_timer_scan or (scan >= self._next_due and not self._timers_held):
            self._fire_timers(now)
            self._next_timer_scan = time.monotonic() + self._config.timer_interval_ms / 1000
            stagings = self._stagings.values()
            self._next_due = self._due_at(_earliest(s.store.next_due_ms(now) for s in stagings))
        self._decide_here(now)
        self._commit()
        written = self._due_at(_earliest(s.take_earliest_due() for s in self._stagings.values()))
        self._next_due = min(self._next_due, written)
        return len(records)

    def _poll_timeout_s(self) -> float:
        """The poll's wait: no longer than until the earliest timer known is due (unless
        timers are held)."""
        if self._timers_held:
            return self._config.poll_timeout_s
        until_due = self._next_due - time.monotonic()
        return max(0.0, min(self._config.poll_timeout_s, until_due))

    def _due_at(self, due_ms: int | None) -> float:
        """When (monotonic seconds) a timer due at ``due_ms`` (clock ms) is due; inf for
        none. The loop scans then, besides every ``timer_interval_ms``: a retry's
        backoff, a sleep or a deadline fires when it is due, not up to a period late."""
        if due_ms is None:
            return math.inf
        return time.monotonic() + (max(0, due_ms - self._clock()) + 1) / 1000

    def _context(self, now: int) -> Context:
        config = self._config
        return Context(
            self._catalog,
            now,
            config.resume_keys,
            config.max_payload_bytes,
            max_infrastructure_losses=config.max_infrastructure_losses,
            live_versions=self._live,
            emit_topics=config.emit_topics,
        )

    def _wake_blocked(self, now: int) -> None:
        """When the fleet of workers changed, dispatch the ``definition_blocked`` runs
        whose version a live worker now loads (committed ones: a run blocked in the
        previous round is in the store by now). At most ``timer_batch`` of each version
        a partition a round; the rest in the next rounds."""
        self._live = live = self._live_versions()
        if not self.fleet.take_change():
            return
        cap = self._config.timer_batch
        for partition, staging in self._stagings.items():
            blocked = blocked_runs(staging.store, cap, live)
            woken = 0
            for _, _, run_id in blocked:
                if run_id in self.skipped_runs:
                    continue
                with logs.run_scope():
                    state = _run(staging, run_id)
                    decide = functools.partial(decide_unblock, state, self._context(now))
                    woken += self._guarded(staging, partition, run_id, source="wake", decide=decide)
            if woken and len(blocked) >= cap:
                self.fleet.changed()  # more to wake: the woken ones leave the index

    def _handle(self, record: Record, now: int) -> None:
        staging = self._stagings.get(record.partition)
        if staging is None:  # not ours (any more); the new owner will read it
            return
        self._batch.consumed[record.position] = record.offset + 1
        self._batch.tally.inputs += 1
        with logs.run_scope():  # what is logged about this input names its run (_run)
            self._handle_in_scope(record, staging, now)

    def _handle_in_scope(self, record: Record, staging: Staging, now: int) -> None:
        try:
            decided = self._decide(self._inputs[record.topic], record, staging, now)
            if decided is not None:
                self._apply(staging, record, *decided, now)
        except FactDecodeError as exc:
            self._reject(record, exc.reason, exc.detail, run_id=None, now=now)
        except TransportError:
            raise  # the outside world failed, not this input: the host retries the round
        except Exception as exc:  # a bug met by this input; it must not stop the partition
            logger.exception("input %s@%d/%d raised", record.topic, record.partition, record.offset)
            self._reject(record, INTERNAL_ERROR, _exception_text(exc), run_id=None, now=now)

    def _decide(
        self, topic: TopicName, record: Record, staging: Staging, now: int
    ) -> tuple[str, Decision] | None:
        """Decode one input and decide on it as its entry in ``INPUTS`` says; None when
        it was forwarded elsewhere or is not about a run."""
        source = INPUTS[topic]
        message = source.decode(record, self._config.resume_keys)
        if isinstance(message, Refusal):  # refused as it was decoded: no run decides it
            if message.run_id:
                logs.bind_run(message.run_id)
            return message.run_id or "", Decision.refuse(message.reason, message.detail)
        entry = source.entry(message, record.value)
        if isinstance(entry, FleetNews):  # heard on every partition: not routed, not decided
            entry.hear(self.fleet, message)
            self._live = self._live_versions()
            return None
        if isinstance(entry, ByKey):  # for the runs waiting on its key, on every partition
            assert isinstance(message, KeyedEvent)
            self._by_key(message, record, now)
            return None
        run_id = entry.run_id(message)
        if not self._routed_here(record, run_id):
            return None
        if run_id in self.skipped_runs:
            return run_id, Decision.refuse(quarantine.QUARANTINED, "skipped until restart")
        state = _run(staging, run_id)
        if state is None and entry.pipeline is not None:  # a new run: its logs name it
            logs.bind_run(run_id, entry.pipeline(message))
        try:
            return run_id, entry.decided(message, state, self._context(now))
        except TransportError:
            raise
        except Exception as exc:  # a bug met by this run's input: quarantine the run
            self._quarantine(staging, record.partition, run_id, source=topic.value, exc=exc)
            return run_id, Decision.refuse(INTERNAL_ERROR, _exception_text(exc))

    def _by_key(self, keyed: KeyedEvent, record: Record, now: int) -> None:
        """An event by correlation key goes through the partitions (docs/design/signals.md):
        this processor asks the waiting runs of each partition it owns that the event has
        not been through (found in the partition's runs index: never a scan of the runs),
        then forwards it, those partitions marked visited and the runs that admitted it
        counted, to the lowest partition left. The processor that finds none left refuses
        it (``no_matching_wait``) when no run admitted it. A run's refusal refuses only
        its own part, with its run id; each step is one transaction."""
        event = keyed.event
        if event.fanned_out and not event.visited:  # a copy for its partition only (older)
            self._ask_partition(keyed, record, record.partition, now)
            return
        visited, matched = set(event.visited), event.matched
        for partition in sorted(set(self._stagings) - visited):
            matched += self._ask_partition(keyed, record, partition, now)
            visited.add(partition)
        visited.add(record.partition)  # read here, so owned here: the event always moves on
        left = [partition for partition in range(self._partitions) if partition not in visited]
        if left:
            onward = {"fanned_out": True, "visited": tuple(sorted(visited)), "matched": matched}
            value = encode(event.model_copy(update=onward))
            self._batch.outbound.append(
                Outbound(record.topic, keyed.key.encode(), value, (), left[0])
            )
        elif matched == 0:
            detail = f"no run admitted event {event.name!r} by key {keyed.key!r}"
            self._reject(record, NO_MATCHING_WAIT, detail, run_id=None, now=now)

    def _ask_partition(self, keyed: KeyedEvent, record: Record, partition: int, now: int) -> int:
        """Decide ``keyed`` for each run of ``partition`` waiting on its key; the runs that
        admitted it."""
        staging = self._stagings[partition]
        admitted = 0
        name, key = keyed.event.name, keyed.key
        for run_id in candidates(staging.store, staging.staged_runs(), name, key):
            if run_id in self.skipped_runs or not waits_on(_run(staging, run_id), name, key):
                continue  # its wait ended since the last commit
            logs.bind_run(run_id)
            decision = self._decide_copy(keyed, run_id, record, partition, now)
            admitted += decision.refusal is None and bool(decision.facts)
            self._apply(staging, record, run_id, decision, now, partition=partition)
        metrics.KEYED_EVENT_COPIES.labels("matched" if admitted else "unmatched").inc()
        return admitted

    def _decide_copy(
        self, keyed: KeyedEvent, run_id: str, record: Record, partition: int, now: int
    ) -> Decision:
        """The decision on a keyed event (``record``) for one waiting run of ``partition``."""
        staging = self._stagings[partition]
        state = _run(staging, run_id)
        if state is not None and state.quarantine is not None:
            return quarantine.refused(state, None)
        try:
            return admit(keyed.arrival(run_id), state, self._context(now))
        except TransportError:
            raise
        except Exception as exc:  # a bug met by this run's event: quarantine the run
            self._quarantine(staging, partition, run_id, source=record.topic, exc=exc)
            return Decision.refuse(INTERNAL_ERROR, _exception_text(exc))

    def _routed_here(self, record: Record, run_id: str) -> bool:
        """Forward a record produced to the wrong partition to its run's partition."""
        right = partition_for(run_id.encode(), self._partitions)
        if right == record.partition:
            return True
        logs.bind_run(run_id)
        logger.warning(
            "%s@%d: run %s belongs to partition %d, forwarding",
            record.topic,
            record.offset,
            run_id,
            right,
        )
        # Verbatim: its rejection there must carry the bytes its producer sent.
        forwarded = Outbound(
            record.topic, run_id.encode(), record.value or b"", record.headers, right, verbatim=True
        )
        self._batch.outbound.append(forwarded)
        return False

    def _fire_timers(self, now: int) -> None:
        for partition, staging in self._stagings.items():
            due = staging.store.due(now, self._config.timer_batch)
            metrics.TIMERS_DUE.labels(str(partition)).set(len(due))
            metrics.TIMERS_FIRED.inc(len(due))
            for entry in due:
                if entry.run_id in self.skipped_runs:
                    continue
                with logs.run_scope():
                    state = _run(staging, entry.run_id)
                    timer = TimerFired(entry)
                    decide = functools.partial(decide_timer, timer, state, self._context(now))
                    source = f"timer:{entry.kind}"
                    self._guarded(staging, partition, entry.run_id, source=source, decide=decide)

    # --- quarantine: no decision may stop the loop ---------------------------------------

    def _guarded(
        self,
        staging: Staging,
        partition: int,
        run_id: str,
        *,
        source: str,
        decide: Callable[[], Decision],
    ) -> bool:
        """Decide and stage a decision that no input asked for (a timer, the fleet
        wake-up); if it raises, quarantine the run. Whether it staged facts."""
        try:
            decision = decide()
            if decision.facts or decision.emits or decision.effects:
                self._append(staging, partition, run_id, decision)
        except TransportError:
            raise
        except Exception as exc:  # a bug about this run: it must not stop the partition
            self._quarantine(staging, partition, run_id, source=source, exc=exc)
            return False
        return bool(decision.facts)

    def _quarantine(
        self,
        staging: Staging,
        partition: int,
        run_id: str,
        *,
        source: str,
        exc: Exception,
    ) -> None:
        """Record that deciding ``source`` for the run raised ``exc`` (``model/quarantine.py``);
        if even that raises, skip the run until this process restarts."""
        logger.error("run %s: deciding %s raised", run_id, source, exc_info=exc)
        state = staging.run(run_id)
        if state is None:
            return  # no run yet (its submission raised): only the input is refused
        metrics.DECISIONS_QUARANTINED.labels(_source_kind(source)).inc()
        try:
            decision = quarantine.decide_quarantine(
                state, source, type(exc).__name__, str(exc), self._clock()
            )
            self._append(staging, partition, run_id, decision)
        except TransportError:
            raise
        except Exception:
            logger.exception("run %s: its quarantine raised too; skipped until restart", run_id)
            metrics.QUARANTINE_FAILED.inc()
            self.skipped_runs.add(run_id)

    def _apply(
        self,
        staging: Staging,
        record: Record,
        run_id: str,
        decision: Decision,
        now: int,
        *,
        partition: int | None = None,
    ) -> None:
        """Stage ``decision`` about the run (of ``partition``: the record's unless said)
        on ``record``; a refusal of it goes to admission.rejected."""
        try:
            if decision.facts or decision.emits or decision.effects:
                run_partition = record.partition if partition is None else partition
                self._append(staging, run_partition, run_id, decision)
        except AppendConflictError as exc:  # a bug, never a reason to stop the partition
            logger.error("append conflict: %s", exc)
            self._reject(record, "append_conflict", str(exc), run_id=run_id, now=now)
            return
        if decision.refusal is not None:
            self._reject(record, decision.refusal, decision.detail, run_id=run_id, now=now)

    def _append(self, staging: Staging, partition: int, run_id: str, decision: Decision) -> None:
        # Everything that may raise comes before the batch changes: a decision is staged
        # whole or not at all (Staging.append is atomic too).
        before = staging.run(run_id)
        trace = _traceparent(before, decision)
        inline = self._inline
        emits: list[Outbound] = []
        kept: list[Emit] = []  # work items this loop runs itself (_decide_here)
        here: list[Record] = []  # inputs this loop decides itself (_here)
        for emit in decision.emits:
            if inline is not None and inline.takes(emit):
                kept.append(emit)
            elif (record := self._here(emit)) is not None:
                here.append(record)
            else:
                emits.append(self._emitted(emit, trace))
        effects = [self._effect(effect, trace) for effect in decision.effects]
        appended = staging.append(
            run_id, decision.expected_version, decision.facts, decision.folded
        )
        key = run_id.encode()
        self._batch.outbound.extend(
            Outbound(self._facts_topic, key, staged.encoded, (), partition) for staged in appended
        )
        self._batch.outbound.extend(emits)
        self._batch.inline.extend(InlineSegment(partition, emit, trace) for emit in kept)
        self._batch.here.extend(here)
        self._batch.effects.extend(effects)
        after = staging.run(run_id) if appended else None
        if after is None:
            return
        self._tally_run(before, after)
        if before is not None and before.quarantine is not None and after.quarantine is None:
            self.fleet.changed()  # released: if it is definition_blocked, wake it
        if after.terminal and (before is None or not before.terminal):
            self._batch.finished.append(after)
        if trace is not None and tracing.enabled():
            facts = tuple(staged.fact for staged in appended)
            self._batch.traced.append(Traced(trace, before, after, facts))

    def _tally_run(self, before: RunState | None, after: RunState) -> None:
        """Note a run that began or ended (recorded in the metrics once committed)."""
        tally = self._batch.tally
        if before is None:
            tally.started.append(after.pipeline)
        if after.terminal and (before is None or not before.terminal):
            seconds = max(0, after.updated_ms - after.submitted_ms) / 1000
            tally.finished.append((after.pipeline, after.status, seconds))

    def _effect(self, effect: Publish, trace: str | None) -> Outbound:
        topic = (
            self._topology.name(effect.topic)
            if isinstance(effect.topic, TopicName)
            else effect.topic
        )
        return Outbound(topic, effect.key.encode(), effect.value, _traced(effect.headers, trace))

    def _reject(
        self, record: Record, reason: str, detail: str, *, run_id: str | None, now: int
    ) -> None:
        logger.info(
            "rejected %s@%d/%d: %s %s",
            record.topic,
            record.partition,
            record.offset,
            reason,
            detail,
        )
        self._batch.tally.rejected.append(reason)
        refusal = rejected(record, reason, detail, now, run_id=run_id)
        key = run_id or (record.key or b"").decode(errors="replace")
        self._batch.outbound.append(self._outbound(TopicName.REJECTED, key, refusal))

    def _outbound(
        self, topic: TopicName, key: str, value: AvroModel, headers: Headers = ()
    ) -> Outbound:
        return Outbound(self._topology.name(topic), key.encode(), encode(value), headers)

    def _emitted(self, emit: Emit, trace: str | None) -> Outbound:
        """An emitted message in its wire: Avro, or a request target's JSON shape; the
        run's traceparent as a header of what goes to workers and the outside."""
        headers = _traced((), trace) if emit.topic in TRACED_TOPICS else ()
        if emit.wire == "json" and isinstance(emit.value, BoundaryRequest):
            value = json_wire.encode_request(emit.value)
            name = self._topology.name(emit.topic)
            return Outbound(name, emit.key.encode(), value, json_wire.request_headers() + headers)
        return self._outbound(emit.topic, emit.key, emit.value, headers)

    # --- inline segments (engine/inline.py) --------------------------------------------

    def _live_versions(self) -> LiveVersions | None:
        """What live workers load, and what this loop runs itself; None while not known."""
        live = self.fleet.live_versions()
        if live is None or self._inline is None:
            return live
        return live | self._inline.versions

    def _decide_here(self, now: int) -> None:
        """Decide, before the batch commits, what its decisions left for this loop: its
        inline segments (``_run_inline``) and the inputs for runs of its own partitions
        (``_here``), and what those decide in turn, until nothing is left."""
        batch, ran = self._batch, 0
        while batch.inline or batch.here:
            segments, batch.inline = batch.inline, []
            ran = self._run_inline(segments, ran, now)
            records, batch.here = batch.here, []
            for record in records:
                with logs.run_scope():
                    self._handle_in_scope(record, self._stagings[record.partition], now)
            metrics.LOCAL_INPUTS.inc(len(records))
        if ran:
            metrics.INLINE_SEGMENTS.inc(ran)

    def _here(self, emit: Emit) -> Record | None:
        """A completion for a run of a partition this loop owns (a child's outcome for its
        parent, a child that may not start) as the input it would have been on
        runs.completions (offset -1: it never was on it). Decided in the same batch, it
        commits with the facts that sent it: no record, hop or transaction more. For a
        run of another processor's partition: None, and it goes out on the topic."""
        if emit.topic is not TopicName.COMPLETIONS or emit.wire != "avro":
            return None
        key = emit.key.encode()
        partition = partition_for(key, self._partitions)
        if partition not in self._stagings:
            return None
        return Record(self._completions_topic, partition, -1, key, encode(emit.value))

    def _run_inline(self, segments: list[InlineSegment], ran: int, now: int) -> int:
        """Run inline segments and decide each result as if it came from segments.results
        (offset -1: it never was on it), so that what follows a segment commits with it;
        what a result dispatches runs too (``_decide_here``), up to the limit a batch
        (``ran`` so far: returned updated), and the rest go out as work items."""
        inline = self._inline
        for segment in segments:
            assert inline is not None  # no work item is kept without it (_append)
            staging = self._stagings.get(segment.partition)
            result = None
            if staging is not None and ran < inline.limit:
                ran += 1
                result = self._run_segment(inline, segment, staging.run(segment.run_id))
            if result is None or staging is None:
                self._batch.outbound.append(self._emitted(segment.emit, segment.trace))
                continue
            record = Record(
                self._results_topic, segment.partition, -1, result.run_id.encode(), encode(result)
            )
            with logs.run_scope():
                self._handle_in_scope(record, staging, now)
        return ran

    def _run_segment(
        self, inline: InlineSteps, segment: InlineSegment, state: RunState | None
    ) -> SegmentResult | None:
        """The segment's result; None if running it raised (a bug: a worker runs it)."""
        try:
            return inline.run(segment, state)
        except Exception:
            item = segment.item
            logger.exception(
                "run %s: its inline segment raised; sent to a worker",
                segment.run_id,
                extra=logs.run_extra(item.run_id, item.pipeline, item.first_step, item.attempt),
            )
            return None

    # --- commit --------------------------------------------------------------------------

    def _commit(self) -> None:
        """Commit everything decided since the last commit, in the numbered order."""
        batch, self._batch = self._batch, _Batch()
        if not batch:
            return
        session = self._session
        assert session is not None
        try:
            # 1. produce facts, outbound messages and terminal publications inside the
            #    open transaction: a publication is visible (read_committed) exactly when
            #    its TerminalPublicationCompleted is, and a fenced zombie's is aborted
            began = time.perf_counter()
            session.begin()
            self._produce(session, batch)
            # 2. commit it together with the consumed input offsets
            produced = session.commit(batch.consumed)
        except TransportError as exc:
            self._not_committed(session, exc)  # the batch's inputs are processed again
            return
        # 3. apply the facts to RocksDB with the facts offset (a crash here is
        #    repaired by catching up from runs.facts on the next start)
        ends = self._flush(produced)
        # 4. telemetry, once per transaction
        self._note_committed(batch, ends, time.perf_counter() - began)
        # 5. logs and spans of what was committed (spans with OpenTelemetry on)
        if batch.finished and logger.isEnabledFor(logging.INFO):
            _log_finished(batch.finished)
        if batch.traced:
            record_spans(batch.traced, self._catalog)

    def _not_committed(self, session: ProcessorSession, exc: TransportError) -> None:
        """Rejoin or abort after a transaction that did not commit."""
        match exc:
            case FencedError():
                logger.warning("fenced: another instance owns our partitions; rejoining")
                self._drop_session()
            case SessionLostError():
                # The stuck transaction is not ours to end: the next session's producer
                # (same transactional.id) fences it, and its partitions are caught up
                # again on assign.
                logger.warning(
                    "session lost, rejoining; the batch will be processed again: %s", exc
                )
                self._drop_session()
            case _:
                logger.warning("commit failed, batch will be processed again: %s", exc)
                self._abort(session)

    def _flush(self, produced: list[tuple[TopicPartition, int]]) -> dict[int, int]:
        """Write each staging's changes with the end of the facts it produced; those ends."""
        ends = _facts_ends(produced, self._facts_topic)
        for partition, staging in self._stagings.items():
            if staging.dirty or partition in ends:
                staging.flush(ends.get(partition))
        return ends

    def _note_committed(self, batch: _Batch, ends: dict[int, int], seconds: float) -> None:
        """The metrics, and the positions the HTTP server reads, of a committed batch."""
        metrics.record_transaction(seconds, batch.tally)
        self.input_positions.update(batch.consumed)
        for partition, end in ends.items():
            self.applied_facts[partition] = end + self._marker
        self.committed_batches += 1

    def _produce(self, session: ProcessorSession, batch: _Batch) -> None:
        outbound = batch.outbound
        if self._config.fact_batches:
            outbound = fact_records.batched(outbound, self._facts_topic)
        for record in outbound:
            session.produce(record)
        for effect in batch.effects:
            session.produce(effect)

    def _abort(self, session: ProcessorSession) -> None:
        for staging in self._stagings.values():
            staging.discard()
        try:
            session.abort()
        except TransportError:
            self._drop_session()

    def reset_session(self) -> None:
        """Forget the current session after a transport failure; the next round rejoins."""
        self._batch = _Batch()
        self._drop_session()

    def _drop_session(self) -> None:
        for partition in list(self._stagings):
            self._on_revoke([TopicPartition(self._facts_topic, partition)])
        session, self._session = self._session, None
        if session is not None:
            _close_quietly(session)


def _earliest(due_times: Iterable[int | None]) -> int | None:
    return min((due for due in due_times if due is not None), default=None)


def _run(staging: Staging, run_id: str) -> RunState | None:
    """The staged run, named as what the input being handled is about (logs)."""
    state = staging.run(run_id)
    if state is not None:
        attempt = state.attempt
        logs.bind_run(run_id, state.pipeline, attempt.next_step, attempt.number or None)
    else:
        logs.bind_run(run_id)
    return state


def _log_finished(runs: list[RunState]) -> None:
    for run in runs:
        fields = logs.run_extra(
            run.run_id, run.pipeline, run.attempt.next_step, run.attempt.number or None
        )
        logger.info("run %s %s (%s)", run.run_id, run.status, run.pipeline, extra=fields)


def _traceparent(state: RunState | None, decision: Decision) -> str | None:
    """The run's traceparent: stored with it, or in the RunSubmitted that starts it."""
    if state is not None:
        return state.traceparent
    for fact in decision.facts:
        if isinstance(fact, RunSubmitted):
            return fact.traceparent
    return None


def _traced(headers: Headers, trace: str | None) -> Headers:
    """``headers`` with the run's ``traceparent`` header added (if it has one)."""
    if trace is None or any(name == TRACEPARENT_HEADER for name, _ in headers):
        return headers
    return (*headers, (TRACEPARENT_HEADER, trace.encode()))


def _close_quietly(session: ProcessorSession) -> None:
    try:
        session.close()
    except TransportError as exc:  # closing a broken session cannot make it worse
        logger.warning("closing the old session failed: %s", exc)


def _source_kind(source: str) -> str:
    """The metric label of a quarantine's source: timer, wake or input."""
    kind = source.partition(":")[0]
    return kind if kind in ("timer", "wake") else "input"


def _exception_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= _MAX_DETAIL else text[: _MAX_DETAIL - 3] + "..."


def _facts_ends(produced: list[tuple[TopicPartition, int]], facts_topic: str) -> dict[int, int]:
    ends: dict[int, int] = {}
    for tp, offset in produced:
        if tp.topic == facts_topic and offset + 1 > ends.get(tp.partition, 0):
            ends[tp.partition] = offset + 1
    return ends
