"""The Python client: submit runs, query status and history.

Submits go through runs.commands like any producer's; the processor answers on
runs.replies, which is how ``created`` is known. ``status`` and ``history`` read
the RocksDB projections of the local state directory (read-only, safe while
``processor run`` has them open). ``current`` answers from anywhere, as of the
end of the log: what the local store has applied (if this machine has it), plus
the run's facts after that offset read from runs.facts and folded on top.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from processor.errors import StoreFormatError
from processor.facts import payload
from processor.facts.codec import codec, decode_fact, decode_facts, encode
from processor.facts.models import CancelRun, CommandReply, FactHeader, ResolveAttempt, SubmitRun
from processor.facts.topics import TopicName
from processor.model.reduce import fold
from processor.model.state import RunState
from processor.store.rocks import PartitionStore, open_existing, store_path
from processor.transport.base import Outbound, Producer, Reader, TopicPartition, Transport
from processor.transport.partitioner import partition_for
from processor.transport.topology import Topology

Command = SubmitRun | CancelRun | ResolveAttempt

__all__ = ["Client", "RunView", "SubmitReceipt", "fact_dict", "new_submit", "status_dict"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RunView:
    """A run as of the end of runs.facts (see ``Client.current``)."""

    state: RunState | None
    history: list[bytes]  # the run's encoded facts in order
    from_log: int  # facts read from runs.facts (past the local store, or all of them)


@dataclass(frozen=True, slots=True)
class SubmitReceipt:
    run_id: str
    created: bool | None  # None: queued, but no processor answered in time
    refusal: str | None = None
    detail: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"run_id": self.run_id, "created": self.created}
        if self.refusal:
            out["refusal"] = self.refusal
            out["detail"] = self.detail
        if self.created is None:
            out["queued"] = True
        return out


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def new_submit(
    pipeline: str,
    input_value: Any,
    idempotency_key: str | None = None,
    now_ms: int | None = None,
    *,
    deadline_ms: int | None = None,
) -> SubmitRun:
    """Build a SubmitRun; the run id derives from the idempotency key when there is one."""
    run_id = payload.derive_run_id(idempotency_key) if idempotency_key else str(uuid.uuid4())
    return SubmitRun(
        command_id=str(uuid.uuid4()),
        run_id=run_id,
        pipeline=pipeline,
        input=payload.dumps(input_value),
        idempotency_key=idempotency_key,
        submitted_ms=now_ms if now_ms is not None else _now_ms(),
        deadline_ms=deadline_ms,
    )


class Client:
    """Talks to a deployment through its log and its local state directory."""

    def __init__(self, transport: Transport, topology: Topology, state_dir: Path) -> None:
        self._transport = transport
        self._topology = topology
        self._state_dir = state_dir
        self._producer: Producer | None = None

    def _partition(self, run_id: str) -> int:
        return partition_for(run_id.encode(), self._topology.partitions)

    def send(self, command: Command) -> None:
        """Produce a command without waiting (call ``flush`` to make it durable)."""
        if self._producer is None:
            self._producer = self._transport.producer()
        topic = self._topology.name(TopicName.COMMANDS)
        self._producer.produce(Outbound(topic, command.run_id.encode(), encode(command)))

    def flush(self) -> None:
        if self._producer is not None:
            self._producer.flush()

    def submit(
        self,
        pipeline: str,
        input_value: Any,
        idempotency_key: str | None = None,
        *,
        wait_s: float = 30.0,
        deadline_ms: int | None = None,
    ) -> SubmitReceipt:
        """Submit a run and wait for the processor's answer (up to ``wait_s``)."""
        command = new_submit(pipeline, input_value, idempotency_key, deadline_ms=deadline_ms)
        reply = self.request(command, wait_s)
        if reply is None:
            return SubmitReceipt(command.run_id, None)
        return SubmitReceipt(reply.run_id, reply.created, reply.refusal, reply.detail)

    def request(self, command: Command, wait_s: float) -> CommandReply | None:
        """Send a command and wait for the processor's reply (None: no answer in time)."""
        replies = TopicPartition(
            self._topology.name(TopicName.REPLIES), self._partition(command.run_id)
        )
        reader = self._transport.reader()
        try:
            start = reader.end_offset(replies)
            self.send(command)
            self.flush()
            return _await_reply(reader, replies, start, command.command_id, wait_s)
        finally:
            reader.close()

    def cancel(self, run_id: str, reason: str = "", *, wait_s: float = 30.0) -> CommandReply | None:
        """Request cancellation: stop intent commits once; the first stop reason wins."""
        command = CancelRun(
            command_id=str(uuid.uuid4()), run_id=run_id, reason=reason, requested_ms=_now_ms()
        )
        return self.request(command, wait_s)

    def resolve(
        self,
        run_id: str,
        *,
        segment: int,
        attempt: int,
        generation: int,
        idempotency_key: str,
        action: str,
        output: Any = None,
        error: str | None = None,
        kind: str = "forward",
        wait_s: float = 30.0,
    ) -> CommandReply | None:
        """Settle an Unknown attempt: action succeed (with output), fail (with error) or retry."""
        command = ResolveAttempt(
            command_id=str(uuid.uuid4()),
            run_id=run_id,
            kind=kind,
            segment=segment,
            attempt=attempt,
            generation=generation,
            idempotency_key=idempotency_key,
            action=action,
            output=payload.dumps(output) if action == "succeed" else None,
            error=error,
        )
        return self.request(command, wait_s)

    def _store(self, run_id: str) -> PartitionStore | None:
        """The local store of the run's partition, read-only; None if there is none, or
        if it is in another format (``current`` then reads the facts from the log)."""
        try:
            return open_existing(store_path(self._state_dir, self._partition(run_id)))
        except StoreFormatError as exc:
            logger.warning("%s; reading runs.facts instead", exc)
            return None

    def status(self, run_id: str) -> RunState | None:
        store = self._store(run_id)
        if store is None:
            return None
        try:
            return store.run(run_id)
        finally:
            store.close()

    def history(self, run_id: str) -> list[FactHeader]:
        store = self._store(run_id)
        if store is None:
            return []
        try:
            return [decode_fact(raw) for raw in store.history(run_id)]
        finally:
            store.close()

    def current(self, run_id: str) -> RunView:
        """The run's projection and history as of the end of runs.facts, from any machine.

        The local store of the run's partition (if any) gives what it has applied,
        as one consistent snapshot; the run's facts after its offset are read from
        runs.facts and folded on top. Without a local store (another machine, a
        client-only host) the whole partition is read: correct, but slower.
        """
        state, history, start = None, [], 0
        store = self._store(run_id)
        if store is not None:
            try:
                state, history, start = (
                    store.run(run_id),
                    store.history(run_id),
                    store.facts_offset(),
                )
            finally:
                store.close()
        facts = TopicPartition(self._topology.name(TopicName.FACTS), self._partition(run_id))
        key = run_id.encode()
        reader = self._transport.reader()
        try:
            tail = [
                record.value
                for batch in reader.read(facts, start)
                for record in batch
                if record.key == key and record.value is not None
            ]
        finally:
            reader.close()
        return RunView(fold(decode_facts(tail), state), history + tail, len(tail))

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
            self._producer = None


def _await_reply(
    reader: Reader, replies: TopicPartition, start: int, command_id: str, wait_s: float
) -> CommandReply | None:
    deadline = time.monotonic() + wait_s
    position = start
    pause = 0.005
    while True:
        for records in reader.read(replies, position):
            for record in records:
                position = record.offset + 1
                reply = codec().decode_as(record.value, CommandReply)
                if reply.command_id == command_id:
                    return reply
        if time.monotonic() >= deadline:
            return None
        time.sleep(pause)  # polling the log for the reply, not synchronizing a test
        pause = min(pause * 2, 0.1)


def status_dict(state: RunState) -> dict[str, Any]:
    """The JSON shape of ``processor status``."""
    return {
        "run_id": state.run_id,
        "pipeline": state.pipeline,
        "pipeline_version": state.pipeline_version,
        "status": state.status,
        "result": _json_or_none(state.result) if state.result is not None else None,
        "error": state.error,
        "error_type": state.error_type,
        "failed_step": state.failed_step,
        "phase": state.phase,
        "segment": state.attempt.segment,
        "attempt": state.attempt.number,
        "generation": state.attempt.generation,
        "next_step": state.attempt.next_step,
        "waiting": _waiting(state),
        "publications": dict(state.publication.targets),
        "deadline_ms": state.deadline_ms,
        "stop_reason": state.stop.reason,
        "stop_detail": state.stop.detail,
        "execution": state.execution,
        "recovery": state.recovery,
        "unknown_attempt": state.unknown.model_dump() if state.unknown else None,
        "compensation": _compensation(state),
        "version": state.version,
        "created_ms": state.created_ms,
        "updated_ms": state.updated_ms,
    }


def _compensation(state: RunState) -> dict[str, Any] | None:
    if not state.compensation.started:
        return None
    return {
        "remaining": list(state.compensation.unwind),
        "compensating_step": state.compensation.step,
        "compensated": state.compensation.compensated,
        "skipped": state.compensation.skipped,
        "failed": state.compensation.failed,
    }


def _waiting(state: RunState) -> dict[str, Any] | None:
    """The boundary a suspended run waits at, with its open interactions."""
    if state.phase != "suspended":
        return None
    interactions = state.boundary_interactions()
    return {
        "boundary": state.boundary.number,
        "kind": state.boundary.kind,
        "itemized": state.boundary.itemized,
        "items": state.boundary.items,
        "open": sum(i.status == "open" for i in interactions),
        "admitted": sum(i.status == "admitted" for i in interactions),
        "timed_out": sum(i.status == "timed_out" for i in interactions),
        "next_deadline_ms": min(
            (i.deadline_ms for i in interactions if i.status == "open"), default=None
        ),
    }


def fact_dict(fact: FactHeader) -> dict[str, Any]:
    """The JSON shape of one fact in ``processor history``."""
    out: dict[str, Any] = {"type": type(fact).__name__}
    for name, value in fact.__dict__.items():
        out[name] = _json_or_none(value) if isinstance(value, bytes) else value
    return out


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.hex()
