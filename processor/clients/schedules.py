"""Schedules from a client: create, pause, resume, delete, list (``Client.schedules``).

A command is checked here first (schedule id, calendar, policies: a ``ScheduleError``
with the reason, nothing produced), then sent to runs.schedules; the schedule stage
decides it and answers on runs.replies (an unknown pipeline is refused there: only the
processor knows the pipelines it runs). Listing folds the facts of runs.schedules, so
it works from any machine.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from processor.clients.polling import poll_until
from processor.facts import payload
from processor.facts.codec import codec, encode
from processor.facts.models import CommandReply, ScheduleCommand, ScheduleRecorded
from processor.facts.topics import TopicName
from processor.model.schedules import (
    ScheduleState,
    check_schedule_id,
    check_spec,
    reduce_schedule,
    spec_of,
)
from processor.transport.base import Outbound, Producer, Record, TopicPartition, Transport
from processor.transport.calendar import CalendarError, calendar, check_calendar
from processor.transport.clock import wall_clock_ms
from processor.transport.partitioner import partition_for
from processor.transport.topology import Topology

__all__ = ["ScheduleError", "ScheduleReceipt", "Schedules", "schedule_dict"]


class ScheduleError(ValueError):
    """A schedule command refused before it is sent: ``reason`` (snake_case) and detail."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class ScheduleReceipt:
    """The stage's answer: whether the command changed the schedule, or its refusal."""

    schedule_id: str
    changed: bool | None  # None: sent, but no processor answered in time
    refusal: str | None = None
    detail: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schedule_id": self.schedule_id, "changed": self.changed}
        if self.refusal:
            out["refusal"] = self.refusal
            out["detail"] = self.detail
        return out


class Schedules:
    """The schedules of a deployment, through its log."""

    def __init__(
        self, transport: Transport, topology: Topology, producer: Callable[[], Producer]
    ) -> None:
        self._transport = transport
        self._topology = topology
        self._producer = producer
        self._topic = topology.name(TopicName.SCHEDULES)

    def create(
        self,
        schedule_id: str,
        pipeline: str,
        input_value: Any = None,
        *,
        cron: str | None = None,
        interval_s: float | None = None,
        timezone: str = "UTC",
        start_ms: int | None = None,
        catch_up: str = "skip",
        catch_up_limit: int = 10,
        overlap: str = "allow",
        jitter_s: float = 0.0,
        wait_s: float = 30.0,
    ) -> ScheduleReceipt:
        """Create a schedule that starts runs of ``pipeline`` with ``input_value`` on a
        cron expression (in ``timezone``, an IANA name) or every ``interval_s``
        seconds (counted from ``start_ms``, default now). ScheduleError if it is
        malformed; the receipt says if the processor refused it (``unknown_pipeline``)."""
        command = ScheduleCommand(
            command_id=str(uuid.uuid4()),
            schedule_id=schedule_id,
            action="create",
            requested_ms=wall_clock_ms(),
            pipeline=pipeline,
            input=payload.dumps(input_value),
            cron=cron,
            interval_ms=None if interval_s is None else round(interval_s * 1000),
            timezone=timezone,
            start_ms=wall_clock_ms() if start_ms is None else start_ms,
            catch_up=catch_up,
            catch_up_limit=catch_up_limit,
            overlap=overlap,
            jitter_ms=round(jitter_s * 1000),
        )
        spec = spec_of(command)
        _check_id(schedule_id)
        _check(check_spec(spec) or check_calendar(spec))
        return self._request(command, wait_s)

    def pause(self, schedule_id: str, *, wait_s: float = 30.0) -> ScheduleReceipt:
        """Stop firing until resumed (fire times that fall due meanwhile are not run)."""
        return self._request(self._command(schedule_id, "pause"), wait_s)

    def resume(self, schedule_id: str, *, wait_s: float = 30.0) -> ScheduleReceipt:
        """Fire again, from the next fire time after now."""
        return self._request(self._command(schedule_id, "resume"), wait_s)

    def delete(self, schedule_id: str, *, wait_s: float = 30.0) -> ScheduleReceipt:
        """Fire no more; its runs stay."""
        return self._request(self._command(schedule_id, "delete"), wait_s)

    def list(self, *, include_deleted: bool = False) -> list[dict[str, Any]]:
        """Every schedule as of the end of runs.schedules, with its next fire time."""
        states: dict[str, ScheduleState] = {}
        reader = self._transport.reader()
        try:
            for partition in range(self._topology.partitions):
                tp = TopicPartition(self._topic, partition)
                for batch in reader.read(tp, 0):
                    for record in batch:
                        _fold(states, record)
        finally:
            reader.close()
        shown = [s for s in states.values() if include_deleted or not s.deleted]
        return [schedule_dict(s) for s in sorted(shown, key=lambda s: s.schedule_id)]

    def get(self, schedule_id: str) -> dict[str, Any] | None:
        """One schedule (None if there is none, or it was deleted)."""
        found = [s for s in self.list() if s["schedule_id"] == schedule_id]
        return found[0] if found else None

    def _command(self, schedule_id: str, action: str) -> ScheduleCommand:
        _check_id(schedule_id)
        return ScheduleCommand(
            command_id=str(uuid.uuid4()),
            schedule_id=schedule_id,
            action=action,
            requested_ms=wall_clock_ms(),
        )

    def _request(self, command: ScheduleCommand, wait_s: float) -> ScheduleReceipt:
        key = command.schedule_id.encode()
        partition = partition_for(key, self._topology.partitions)
        replies = TopicPartition(self._topology.name(TopicName.REPLIES), partition)
        reader = self._transport.reader()
        try:
            start = reader.end_offset(replies)
            producer = self._producer()
            producer.produce(Outbound(self._topic, key, encode(command), (), partition))
            producer.flush()
            reply = _await(reader, replies, start, command.command_id, wait_s)
        finally:
            reader.close()
        if reply is None:
            return ScheduleReceipt(command.schedule_id, None)
        return ScheduleReceipt(command.schedule_id, reply.created, reply.refusal, reply.detail)


def _check(refusal: tuple[str, str] | None) -> None:
    if refusal is not None:
        raise ScheduleError(*refusal)


def _check_id(schedule_id: str) -> None:
    wrong = check_schedule_id(schedule_id)
    if wrong is not None:
        raise ScheduleError("bad_schedule_id", wrong)


def _fold(states: dict[str, ScheduleState], record: Record) -> None:
    try:
        fact = codec().decode(record.value)
    except Exception:  # a refused command's bytes: the stage rejected it
        return
    if isinstance(fact, ScheduleRecorded):
        after = reduce_schedule(states.get(fact.schedule_id), fact)
        if after is not None:
            states[fact.schedule_id] = after


def _await(
    reader: Any, replies: TopicPartition, start: int, command_id: str, wait_s: float
) -> CommandReply | None:
    position = start

    def attempt() -> CommandReply | None:
        nonlocal position
        for records in reader.read(replies, position):
            for record in records:
                position = record.offset + 1
                reply = codec().decode_as(record.value, CommandReply)
                if reply.command_id == command_id:
                    return reply
        return None

    return poll_until(attempt, time.monotonic() + wait_s)


def schedule_dict(state: ScheduleState) -> dict[str, Any]:
    """A schedule as JSON: its spec, paused, last fire, last run and next fire time."""
    spec = state.spec
    next_fire: int | None = None
    if not state.paused and not state.deleted:
        try:
            next_fire = calendar(spec)(state.after_ms)
        except CalendarError:
            next_fire = None
    return {
        "schedule_id": state.schedule_id,
        "pipeline": spec.pipeline,
        "input": payload.loads(spec.input),
        "cron": spec.cron,
        "interval_s": None if spec.interval_ms is None else spec.interval_ms / 1000,
        "timezone": spec.timezone,
        "start_ms": spec.start_ms,
        "catch_up": spec.catch_up,
        "catch_up_limit": spec.catch_up_limit,
        "overlap": spec.overlap,
        "jitter_s": spec.jitter_ms / 1000,
        "paused": state.paused,
        "deleted": state.deleted,
        "created_ms": state.created_ms,
        "last_fire_ms": state.last_fired_ms,
        "last_run_id": state.last_run_id,
        "queued_fire_ms": state.queued_fire_ms,
        "next_fire_ms": next_fire,
        "fired": state.fired,
        "skipped": state.skipped,
    }
