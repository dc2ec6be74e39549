"""The schedule stage: decides schedule commands and fires due schedules, exactly once.

A consumer-group member of its own (group ``<group>.schedules``) owns partitions of
``runs.schedules`` (keyed by schedule id), with a transactional session of its own.
A schedule's state is the fold of its ``ScheduleRecorded`` facts; on assignment the
stage folds each partition's facts to its end (``_restore``), from the offset of the
partition's snapshot in the state directory if there is one, else from the start
(``store/schedule_snapshots.py``), so the next fire time is derived from durable facts
after any crash or move. Each round:

1. decide each polled command (a created, paused, resumed or deleted fact, or a
   refusal to admission.rejected) and answer it on runs.replies,
2. for each owned schedule, plan the fire times due by now (``plan_fires``): a
   SubmitRun on runs.commands per fire, under the run id of the schedule and the fire
   time, and the fact recording it,
3. produce all of it in one transaction with the consumed offsets, then, once it
   committed, fold the new facts into the owned state.

A round that polled nothing is followed by a pause (``idle_s``, 0.1 s), not by a
poll that waits: the embedded log wakes a waiting poll whenever any process commits,
about ten times a run, and a stage that needs no millisecond latency paid ~1 ms of
the processor's CPU a run for it. A command or a due fire waits at most that pause.

A crash before 3 commits nothing: the round is decided again. A redo that submits a
fire again (a zombie fenced too late, a fact not yet read back) submits the same run
id with the same fields: the run's partition answers it as a repeat, starting nothing.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from processor.errors import FencedError, SessionLostError, TransportError
from processor.facts.codec import codec, decode_facts, encode
from processor.facts.models import (
    AvroModel,
    CommandReply,
    ScheduleCommand,
    ScheduleRecorded,
    SubmitRun,
)
from processor.facts.rejection import rejected
from processor.facts.topics import TopicName
from processor.model.reduce import fold
from processor.model.schedules import (
    NextFire,
    Refused,
    ScheduleSpec,
    ScheduleState,
    decide_command,
    fire_fact,
    plan_fires,
    reduce_schedule,
    spec_of,
)
from processor.store import schedule_snapshots
from processor.store.readers import LocalStores
from processor.transport.base import Outbound, ProcessorSession, Record, TopicPartition, Transport
from processor.transport.calendar import CalendarError, calendar, check_calendar
from processor.transport.clock import Clock, wall_clock_ms
from processor.transport.partitioner import partition_for
from processor.transport.topology import Topology

__all__ = ["RunEnded", "RunEndedReader", "ScheduleStage", "schedule_group"]

logger = logging.getLogger(__name__)

_MAX_PAUSE_S = 5.0
#: How often, at most, a partition's snapshot is written while its schedules change.
SNAPSHOT_EVERY_S = 10.0
_SUBMIT_NAMESPACE = uuid.UUID("5c4e1d2a-52a7-4a53-9d0a-3f1f3f0b7c11")
#: Whether a run has ended (True), still runs (False); None if unknown (not submitted yet).
RunEnded = Callable[[str], bool | None]


def schedule_group(group: str) -> str:
    """The consumer group (and transactional-id stem) of the schedule stage."""
    return f"{group}.schedules"


@dataclass
class _Round:
    outbound: list[Outbound] = field(default_factory=list)
    consumed: dict[TopicPartition, int] = field(default_factory=dict)


class ScheduleStage:
    """Owns partitions of runs.schedules: decides their commands, fires their schedules."""

    def __init__(
        self,
        transport: Transport,
        topology: Topology,
        *,
        group: str,
        instance_id: str,
        pipelines: frozenset[str],
        run_ended: RunEnded,
        clock: Clock = wall_clock_ms,
        max_batch: int = 500,
        idle_s: float = 0.1,
        snapshots: Path | None = None,
        snapshot_every_s: float = SNAPSHOT_EVERY_S,
    ) -> None:
        self._transport = transport
        self._topology = topology
        self._group = schedule_group(group)
        self._instance_id = instance_id
        self._pipelines = pipelines
        self._run_ended = run_ended
        self._clock = clock
        self._max_batch = max_batch
        self._idle_s = idle_s
        self._topic = topology.name(TopicName.SCHEDULES)
        self._session: ProcessorSession | None = None
        # Owned partitions -> schedule id -> state (committed), and each partition's
        # offset below which every fact is folded already.
        self._owned: dict[int, dict[str, ScheduleState]] = {}
        self._folded_to: dict[int, int] = {}
        self.submitted = 0  # runs submitted since the start (tests)
        self._broken: set[str] = set()  # schedules whose planning raised (``_fire_guarded``)
        # Where the snapshots live (None: none are kept), the partitions changed since
        # their last one, and when each was written (monotonic seconds).
        self._snapshots = snapshots
        self._snapshot_every_s = snapshot_every_s
        self._changed: set[int] = set()
        self._snapshot_at: dict[int, float] = {}
        #: Per partition restored: the offset its fold began at and the records it read.
        self.restored: dict[int, tuple[int, int]] = {}

    # --- lifecycle -----------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Decide and fire until ``stop`` is set; wait out (and log) an unavailable log."""
        pause = 0.1
        try:
            while not stop.is_set():
                try:
                    if not self.run_once():
                        stop.wait(self._idle_s)
                    pause = 0.1
                except TransportError as exc:
                    logger.warning("schedules: %s; retrying in %.1fs", exc, pause)
                    self._drop_session()
                    stop.wait(pause)
                    pause = min(pause * 2, _MAX_PAUSE_S)
        finally:
            self.close()

    def close(self) -> None:
        self._snapshot(set(self._changed))  # the committed state, before it is dropped
        self._drop_session()
        closing = getattr(self._run_ended, "close", None)
        if closing is not None:
            closing()

    def schedules(self) -> list[ScheduleState]:
        """The owned schedules, as committed (tests and the status of this process)."""
        return [s for owned in list(self._owned.values()) for s in list(owned.values())]

    def _join(self) -> ProcessorSession:
        session = self._transport.session(self._group, self._instance_id)
        try:
            session.subscribe([self._topic], self._on_assign, self._on_revoke)
        except BaseException:
            _close_quietly(session)
            raise
        self._session = session
        return session

    def _on_assign(self, assigned: Sequence[TopicPartition]) -> None:
        for partition in sorted({tp.partition for tp in assigned} - set(self._owned)):
            self._restore(partition)

    def _on_revoke(self, revoked: Sequence[TopicPartition]) -> None:
        self._snapshot({tp.partition for tp in revoked} & self._changed)
        for tp in revoked:
            self._owned.pop(tp.partition, None)
            self._folded_to.pop(tp.partition, None)

    def _restore(self, partition: int) -> None:
        """Fold the committed facts of ``partition`` after its snapshot (or all of them):
        its schedules as they stand."""
        tp = TopicPartition(self._topic, partition)
        found = None
        if self._snapshots is not None:
            path = schedule_snapshots.snapshot_path(self._snapshots, self._topic, partition)
            found = schedule_snapshots.load(path, self._topic)
        start, owned = (0, {}) if found is None else (found.offset, dict(found.schedules))
        reader = self._transport.reader()
        end, read = start, 0
        try:
            reader.wait_stable(tp, 30.0)
            for batch in reader.read(tp, start):
                for record in batch:
                    end, read = record.offset + 1, read + 1
                    fact = _decoded(record)
                    if isinstance(fact, ScheduleRecorded):
                        _fold_into(owned, fact)
        finally:
            reader.close()
        self._owned[partition] = owned
        self._folded_to[partition] = end
        self.restored[partition] = (start, read)
        self._snapshot_at[partition] = time.monotonic()
        if read:
            self._changed.add(partition)
        logger.info(
            "schedules partition %d: %d schedules restored (%d records read from offset %d)",
            partition,
            len(owned),
            read,
            start,
        )

    # --- one round -----------------------------------------------------------------------

    def run_once(self) -> int:
        """Poll, decide commands, fire due schedules, commit; return the records polled."""
        session = self._session or self._join()
        records = session.poll(self._max_batch, 0.0)
        now = self._clock()
        staged = {p: dict(owned) for p, owned in self._owned.items()}
        round_ = _Round()
        for record in records:
            round_.consumed[record.position] = record.offset + 1
            self._handle(record, staged, round_, now)
        for owned in staged.values():
            for state in list(owned.values()):
                self._fire_guarded(state, owned, round_, now)
        if round_.outbound or round_.consumed:
            self._commit(session, round_, staged)
        return len(records)

    def _handle(
        self, record: Record, staged: dict[int, dict[str, ScheduleState]], round_: _Round, now: int
    ) -> None:
        owned = staged.get(record.partition)
        if owned is None:
            return
        try:
            message = _decoded(record)
        except Exception as exc:  # bad bytes: refused with their reason, never lost
            round_.outbound.append(self._rejected(record, "undecodable", str(exc), now))
            return
        if isinstance(message, ScheduleRecorded):
            if record.offset >= self._folded_to.get(record.partition, 0):
                _fold_into(owned, message)  # written by a previous owner, not folded yet
            return
        if not isinstance(message, ScheduleCommand):
            detail = f"expected a schedule command, got {type(message).__name__}"
            round_.outbound.append(self._rejected(record, "wrong_schema", detail, now))
            return
        try:
            self._decide(record, message, owned, round_, now)
        except TransportError:
            raise
        except Exception as exc:  # a bug met by this command: refuse it, go on
            logger.exception("schedule %s: deciding a command raised", message.schedule_id)
            detail = f"{type(exc).__name__}: {exc}"[:2000]
            round_.outbound.append(self._rejected(record, "internal_error", detail, now))
            self._reply(round_, message, False, "internal_error", detail)

    def _fire_guarded(
        self, state: ScheduleState, owned: dict[str, ScheduleState], round_: _Round, now: int
    ) -> None:
        """``_fire``; a schedule whose planning raises (a bug) is left alone until this
        process restarts, so that no schedule stops the others."""
        if state.schedule_id in self._broken:
            return
        try:
            self._fire(state, owned, round_, now)
        except TransportError:
            raise
        except Exception:
            logger.exception(
                "schedule %s: planning raised; skipped until restart", state.schedule_id
            )
            self._broken.add(state.schedule_id)

    def _decide(
        self,
        record: Record,
        command: ScheduleCommand,
        owned: dict[str, ScheduleState],
        round_: _Round,
        now: int,
    ) -> None:
        state = owned.get(command.schedule_id)
        refusal = check_calendar(spec_of(command)) if command.action == "create" else None
        decided = decide_command(
            command, state, now, pipelines=self._pipelines, calendar_refusal=refusal
        )
        if isinstance(decided, Refused):
            logger.info("schedule %s refused: %s", command.schedule_id, decided.reason)
            round_.outbound.append(self._rejected(record, decided.reason, decided.detail, now))
            self._reply(round_, command, False, decided.reason, decided.detail)
            return
        if decided is not None:
            self._record(round_, owned, decided)
        self._reply(round_, command, decided is not None, None, None)

    def _fire(
        self, state: ScheduleState, owned: dict[str, ScheduleState], round_: _Round, now: int
    ) -> None:
        if state.paused or state.deleted:
            return
        try:
            next_fire = _calendar(state.spec)
        except CalendarError:  # validated on create; a zone gone from this machine
            logger.warning("schedule %s: its calendar is unusable here", state.schedule_id)
            return
        plan = plan_fires(state, next_fire, now, last_run_running=False)
        if plan and state.last_run_id is not None and state.spec.overlap != "allow":
            # Asked only when something is due: the last run may be on another partition
            running = self._run_ended(state.last_run_id) is False
            plan = plan_fires(state, next_fire, now, last_run_running=running)
        cause = f"tick/{now}"
        for fire in plan:
            fact = fire_fact(state, fire, now, cause)
            if fire.kind == "fired" and fact.run_id is not None:
                round_.outbound.append(self._submit(state, fact.run_id, fire.fire_ms))
            self._record(round_, owned, fact)
            state = owned[state.schedule_id]

    def _record(
        self, round_: _Round, owned: dict[str, ScheduleState], fact: ScheduleRecorded
    ) -> None:
        _fold_into(owned, fact)
        round_.outbound.append(self._outbound(self._topic, fact.schedule_id, fact))

    def _submit(self, state: ScheduleState, run_id: str, fire_ms: int) -> Outbound:
        """The SubmitRun of a fire time: every field derived, so a redo is the same submit.
        It names the schedule and the fire time, which the run records."""
        command = SubmitRun(
            command_id=str(uuid.uuid5(_SUBMIT_NAMESPACE, run_id)),
            run_id=run_id,
            pipeline=state.spec.pipeline,
            input=state.spec.input,
            submitted_ms=fire_ms,
            schedule_id=state.schedule_id,
            fire_ms=fire_ms,
        )
        key = run_id.encode()
        partition = partition_for(key, self._topology.partitions)
        topic = self._topology.name(TopicName.COMMANDS)
        return Outbound(topic, key, encode(command), (), partition)

    def _reply(
        self,
        round_: _Round,
        command: ScheduleCommand,
        created: bool,
        refusal: str | None,
        detail: str | None,
    ) -> None:
        reply = CommandReply(
            command_id=command.command_id,
            run_id=command.schedule_id,
            created=created,
            refusal=refusal,
            detail=detail,
        )
        replies = self._topology.name(TopicName.REPLIES)
        key = command.schedule_id.encode()
        partition = partition_for(key, self._topology.partitions)
        round_.outbound.append(Outbound(replies, key, encode(reply), (), partition))

    def _rejected(self, record: Record, reason: str, detail: str, now: int) -> Outbound:
        value = encode(rejected(record, reason, detail, now))
        return Outbound(self._topology.name(TopicName.REJECTED), record.key or b"", value)

    def _outbound(self, topic: str, key: str, value: AvroModel) -> Outbound:
        encoded = key.encode()
        partition = partition_for(encoded, self._topology.partitions)
        return Outbound(topic, encoded, encode(value), (), partition)

    def _commit(
        self,
        session: ProcessorSession,
        round_: _Round,
        staged: dict[int, dict[str, ScheduleState]],
    ) -> None:
        try:
            # 1. facts, submits, replies and rejections inside one transaction
            session.begin()
            for record in round_.outbound:
                session.produce(record)
            # 2. committed with the consumed offsets of runs.schedules
            produced = session.commit(round_.consumed)
        except (FencedError, SessionLostError) as exc:
            logger.warning("schedules: %s; rejoining, the round is decided again", exc)
            self._drop_session()
            return
        except TransportError as exc:
            logger.warning("schedules: commit failed, the round is decided again: %s", exc)
            self._abort(session)
            return
        # 3. the new facts are committed: fold them into the owned state, and skip them
        #    when they are polled back
        for partition, owned in staged.items():
            if partition in self._owned:
                self._owned[partition] = owned
        for tp, offset in produced:
            if tp.topic == self._topic and tp.partition in self._folded_to:
                self._folded_to[tp.partition] = max(self._folded_to[tp.partition], offset + 1)
                self._changed.add(tp.partition)
        commands = self._topology.name(TopicName.COMMANDS)
        self.submitted += sum(1 for record in round_.outbound if record.topic == commands)
        # 4. now and then, a snapshot of what changed (committed state only)
        since = time.monotonic() - self._snapshot_every_s
        self._snapshot({p for p in self._changed if self._snapshot_at.get(p, 0.0) <= since})

    def _abort(self, session: ProcessorSession) -> None:
        try:
            session.abort()
        except TransportError:
            self._drop_session()

    def _snapshot(self, partitions: set[int]) -> None:
        """Write the snapshots of ``partitions`` (owned, committed state); a failure to
        write one only costs the next restore a longer fold."""
        if self._snapshots is None:
            return
        for partition in sorted(partitions):
            owned, offset = self._owned.get(partition), self._folded_to.get(partition)
            if owned is None or offset is None:
                continue
            path = schedule_snapshots.snapshot_path(self._snapshots, self._topic, partition)
            try:
                schedule_snapshots.save(path, self._topic, offset, owned)
            except OSError as exc:
                logger.warning("schedules partition %d: snapshot not written: %s", partition, exc)
                continue
            self._changed.discard(partition)
            self._snapshot_at[partition] = time.monotonic()

    def _drop_session(self) -> None:
        session, self._session = self._session, None
        self._owned.clear()
        self._folded_to.clear()
        self._changed.clear()
        if session is not None:
            _close_quietly(session)


@functools.lru_cache(maxsize=4096)
def _calendar(spec: ScheduleSpec) -> NextFire:
    """The schedule's calendar, its answers kept: each round asks every schedule for
    its next fire time after the same time until it fires."""
    return functools.lru_cache(maxsize=8)(calendar(spec))


def _decoded(record: Record) -> object:
    return codec().decode(record.value)


def _fold_into(owned: dict[str, ScheduleState], fact: ScheduleRecorded) -> None:
    after = reduce_schedule(owned.get(fact.schedule_id), fact)
    if after is not None:
        owned[fact.schedule_id] = after


def _close_quietly(session: ProcessorSession) -> None:
    try:
        session.close()
    except TransportError as exc:
        logger.warning("schedules: closing the old session failed: %s", exc)


class RunEndedReader:
    """Whether a run has ended, as of the end of runs.facts: the local store of its
    partition (a secondary reader, as the HTTP API's: never the loop's own handle,
    which another thread may close) and the run's facts after its offset, or the
    whole partition where there is no store (another machine owns it). Asked only
    when a fire is due under an overlap policy; used by the stage's thread alone."""

    def __init__(self, transport: Transport, topology: Topology, state_dir: Path) -> None:
        self._transport = transport
        self._topology = topology
        self._stores = LocalStores(state_dir)

    def __call__(self, run_id: str) -> bool | None:
        key = run_id.encode()
        partition = partition_for(key, self._topology.partitions)
        state, start = None, 0
        for store in self._stores.refresh([partition]):
            state, start = store.run(run_id), store.facts_offset()
        tp = TopicPartition(self._topology.name(TopicName.FACTS), partition)
        reader = self._transport.reader()
        try:
            tail = [
                r.value
                for batch in reader.read(tp, start)
                for r in batch
                if r.key == key and r.value is not None
            ]
        finally:
            reader.close()
        run = fold(decode_facts(tail), state)
        return None if run is None else run.terminal

    def close(self) -> None:
        self._stores.close()
