"""The Python client: submit runs, wait for their outcome, query status and history.

```python
from processor import Client

with Client() as client:                     # Settings() from the environment
    receipt = client.submit("orders", {"order_id": "o-1", "amount": 12})
    result = client.wait(receipt.run_id, timeout_s=60)
```

Submits go through runs.commands like any producer's; the processor answers on
runs.replies, which is how ``created`` is known. ``status``, ``history`` and
``wait`` answer from anywhere, as of the end of the log (``current``): what the
local store has applied (if this machine has it), plus the run's facts after
that offset read from runs.facts and folded on top. ``stored_status`` and
``stored_history`` read only the RocksDB projection of the local state
directory (read-only, safe while ``processor run`` has it open).
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from processor.clients.completion_lookup import find_completion
from processor.clients.completion_receipt import AdmissionWatch, CompletionReceipt
from processor.clients.external import CompletionClient
from processor.clients.outcome import RunResult, terminal_result
from processor.clients.polling import poll_until
from processor.clients.schedules import Schedules
from processor.clients.signals import SentEvent, build_event, send_event
from processor.config.settings import Settings, default_of
from processor.errors import (
    ConfigurationError,
    ProcessorError,
    StoreFormatError,
    UnknownRunError,
    WaitTimeoutError,
)
from processor.facts import payload, tokens
from processor.facts.codec import codec, decode_fact, decode_facts, encode
from processor.facts.models import (
    CancelRun,
    CommandReply,
    FactHeader,
    RedriveRun,
    ReleaseRun,
    ResolveAttempt,
    SubmitRun,
)
from processor.facts.topics import TopicName
from processor.facts.traceparent import is_traceparent
from processor.model import children, waits
from processor.model.due import due_entries
from processor.model.reduce import fold
from processor.model.state import RunState
from processor.store.rocks import PartitionStore, open_existing, store_path
from processor.telemetry import tracing
from processor.transport.base import (
    Closeable,
    Outbound,
    Producer,
    Reader,
    Record,
    TopicPartition,
    Transport,
)
from processor.transport.clock import wall_clock_ms
from processor.transport.deployment import Deployment, ensure_topics
from processor.transport.partitioner import partition_for
from processor.transport.topology import Topology

Command = SubmitRun | CancelRun | ResolveAttempt | RedriveRun | ReleaseRun

__all__ = [
    "Client",
    "CompletionReceipt",
    "RunResult",
    "RunView",
    "SubmitReceipt",
    "check_step_index",
    "check_traceparent",
    "fact_dict",
    "new_submit",
    "status_dict",
]

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RunView:
    """A run as of the end of runs.facts (see ``Client.current``)."""

    state: RunState | None
    history: list[bytes]  # the run's encoded facts in order
    from_log: int  # facts read from runs.facts (past the local store, or all of them)


@dataclass(frozen=True, slots=True)
class _RunRead:
    """A run read up to the end of its runs.facts partition, and where that end was."""

    view: RunView
    facts: TopicPartition
    next_offset: int


@dataclass(frozen=True, slots=True)
class SubmitReceipt:
    """The processor's answer to a submit: the run id, and whether this call created it."""

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


def new_submit(
    pipeline: str,
    input_value: Any,
    idempotency_key: str | None = None,
    now_ms: int | None = None,
    *,
    deadline_ms: int | None = None,
    deadline_after_ms: int | None = None,
    traceparent: str | None = None,
) -> SubmitRun:
    """Build a SubmitRun; the run id derives from the idempotency key when there is one.

    ``deadline_after_ms`` is a deadline relative to the submit that creates the run, so
    a retry of the same submit is the same submit (its fingerprint covers the relative
    value); ``deadline_ms`` is an absolute one. ``traceparent``: a W3C traceparent the
    run's trace continues (ValueError if it is not one).
    """
    check_traceparent(traceparent)
    for deadline in (deadline_ms, deadline_after_ms):
        _check_range(deadline, "a deadline", _MAX_LONG, "ms")
    run_id = payload.derive_run_id(idempotency_key) if idempotency_key else str(uuid.uuid4())
    return SubmitRun(
        command_id=str(uuid.uuid4()),
        run_id=run_id,
        pipeline=pipeline,
        input=payload.dumps(input_value),
        idempotency_key=idempotency_key,
        submitted_ms=now_ms if now_ms is not None else wall_clock_ms(),
        deadline_ms=deadline_ms,
        deadline_after_ms=deadline_after_ms,
        traceparent=traceparent,
    )


#: The largest Avro long and int: what a command's millisecond times and step indexes fit.
_MAX_LONG = 2**63 - 1
_MAX_INT = 2**31 - 1


def _check_range(value: int | None, what: str, most: int, unit: str = "") -> None:
    """ValueError unless ``value`` is None or from 0 to ``most`` (what a command carries)."""
    if value is not None and not 0 <= value <= most:
        shown = f"{most} {unit}".rstrip()
        raise ValueError(f"{what} must be from 0 to {shown}, got {value}")


def check_step_index(from_step: int | None) -> None:
    """ValueError unless ``from_step`` is None or a step index a command can carry."""
    _check_range(from_step, "a step index", _MAX_INT)


def check_traceparent(traceparent: str | None) -> None:
    """ValueError unless ``traceparent`` is None or a valid W3C traceparent."""
    if traceparent is not None and not is_traceparent(traceparent):
        raise ValueError(
            f"traceparent {traceparent!r} is not a W3C traceparent "
            "(00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>)"
        )


class Client(Closeable):
    """Talks to a deployment through its log and its local state directory.

    ``Client()`` works against the deployment that ``Settings()`` names (the
    environment's ``PROCESSOR_*`` variables; by default the embedded log under
    ``.processor``); ``Client(settings=...)`` or ``Client.from_settings(...)``
    against another; ``Client(transport, topology, state_dir)`` against parts
    built by the caller (``group``: the processors' consumer group, if not the
    default). A client is a context manager: leaving the block closes its producers.
    """

    def __init__(
        self,
        transport: Transport | None = None,
        topology: Topology | None = None,
        state_dir: Path | None = None,
        *,
        settings: Settings | None = None,
        max_payload_bytes: int | None = None,
        group: str | None = None,
    ) -> None:
        parts = (transport, topology, state_dir)
        self._deployment: Deployment | None = None
        if transport is None or topology is None or state_dir is None:
            if any(part is not None for part in parts):
                raise ConfigurationError(
                    "Client takes a transport, a topology and a state dir together, or settings"
                )
            self._deployment = Deployment.from_settings(settings or Settings())
            transport, topology = self._deployment.transport, self._deployment.topology
            state_dir = self._deployment.settings.state_dir
        elif settings is not None:
            raise ConfigurationError("Client takes settings or a transport, not both")
        self._transport = transport
        self._topology = topology
        self._state_dir = state_dir
        # The client refuses an oversized payload before producing it; without a limit
        # given, the settings' (or the default) one.
        self._max_payload_bytes = max_payload_bytes or (
            self._deployment.settings.max_payload_bytes
            if self._deployment is not None
            else default_of("max_payload_bytes")
        )
        # The processors' consumer group: a completion's wait reads its committed offsets.
        self._group = (
            self._deployment.settings.group
            if self._deployment is not None
            else group or default_of("group")
        )
        self._producer: Producer | None = None
        self._completions: CompletionClient | None = None
        self._rejected_partitions: int | None = None

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> Client:
        """A client of the deployment ``settings`` name (default: ``Settings()``)."""
        return cls(settings=settings or Settings())

    def _partition(self, run_id: str) -> int:
        return partition_for(run_id.encode(), self._topology.partitions)

    def send(self, command: Command) -> None:
        """Produce a command without waiting (call ``flush`` to make it durable)."""
        topic = self._topology.name(TopicName.COMMANDS)
        self._command_producer().produce(Outbound(topic, command.run_id.encode(), encode(command)))

    def _command_producer(self) -> Producer:
        if self._producer is None:
            if self._deployment is not None:
                # A client built from settings may be the first to use the log.
                ensure_topics(self._deployment)
            self._producer = self._transport.producer()
        return self._producer

    @property
    def schedules(self) -> Schedules:
        """Create, pause, resume, delete and list schedules (``clients/schedules.py``)."""
        return Schedules(self._transport, self._topology, self._command_producer)

    def flush(self) -> None:
        """Wait until every command sent is durable in runs.commands."""
        if self._producer is not None:
            self._producer.flush()

    def submit(
        self,
        pipeline: str,
        input_value: Any,
        idempotency_key: str | None = None,
        *,
        deadline_s: float | None = None,
        deadline_ms: int | None = None,
        wait_s: float = 30.0,
        traceparent: str | None = None,
    ) -> SubmitReceipt:
        """Submit a run and wait for the processor's answer (up to ``wait_s``).

        Args:
            pipeline: the pipeline's name.
            input_value: the run input, any JSON value.
            idempotency_key: the run id derives from it; a retry with the same
                fields returns the original run (``created`` False).
            deadline_s: a run deadline this many seconds after the submit that
                creates the run (overrides the pipeline's; a retry with the same
                value is the same submit); ``deadline_ms`` gives it as epoch
                milliseconds.
            wait_s: how long to wait for the processor's answer; without one in
                time the receipt says ``created=None`` (queued).
            traceparent: a W3C traceparent (the caller's trace): the run's work,
                requests, results and outcome carry it, and its spans (with
                OpenTelemetry on) belong to that trace. ValueError if malformed.

        Raises ``PayloadTooLarge`` (a ValueError), producing nothing, if the input's
        canonical JSON is over the payload limit (``PROCESSOR_MAX_PAYLOAD_BYTES``).
        """
        if deadline_s is not None and deadline_ms is not None:
            raise ValueError("give deadline_s or deadline_ms, not both")
        check_traceparent(traceparent)
        if deadline_s is not None and not math.isfinite(deadline_s):
            raise ValueError(f"a deadline must be a finite number of seconds, got {deadline_s}")
        after_ms = None if deadline_s is None else round(deadline_s * 1000)
        with tracing.submit_span(traceparent, pipeline=pipeline) as span:
            command = new_submit(
                pipeline,
                input_value,
                idempotency_key,
                deadline_ms=deadline_ms,
                deadline_after_ms=after_ms,
                traceparent=span.traceparent,
            )
            span.annotate(run_id=command.run_id)
            payload.check_size(command.input, self._max_payload_bytes, "run input")
            reply = self.request(command, wait_s)
            if reply is not None and reply.refusal:
                span.fail(reply.refusal, reply.detail or "")
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

    def complete(
        self, token: str, value: Any, idempotency_key: str | None = None, *, wait_s: float = 0.0
    ) -> CompletionReceipt:
        """Answer an await with ``value`` (the resume token is the one of its
        boundary.requests record); see ``answer``."""
        body = payload.dumps(value)
        return self.answer(
            token, "success", body, None, idempotency_key=idempotency_key, wait_s=wait_s
        )

    def fail(
        self, token: str, error: str, idempotency_key: str | None = None, *, wait_s: float = 0.0
    ) -> CompletionReceipt:
        """Answer an await with a failure (the step's ``on_timeout`` does not apply); see
        ``answer``."""
        return self.answer(
            token, "failure", b"", error, idempotency_key=idempotency_key, wait_s=wait_s
        )

    def answer(
        self,
        token: str,
        outcome: str,
        body: bytes,
        error: str | None,
        *,
        idempotency_key: str | None = None,
        wait_s: float = 0.0,
    ) -> CompletionReceipt:
        """Produce a completion (``outcome`` success with the JSON ``body``, or failure with
        ``error``) and wait up to ``wait_s`` for what the processor's admission stage made
        of it: ``admission`` is ``admitted``, ``duplicate`` (the same answer was admitted
        before: nothing changed), ``refused`` (with the ``refusal`` reason and ``detail``),
        or ``queued`` (not waited for, or no decision within ``wait_s``).

        Raises ``PayloadTooLarge`` (a ValueError), producing nothing, if the payload is
        over the payload limit, and ``ProcessorError`` if ``token`` is not a token.
        """
        completions = self._completion_client()
        if wait_s <= 0:
            return completions.deliver(token, outcome, body, error, idempotency_key)
        claims = tokens.parse(token)
        if claims is None:
            raise ProcessorError("not a resume token")
        deadline = time.monotonic() + wait_s
        reader, admin = self._transport.reader(), self._transport.admin()
        try:
            watch = AdmissionWatch(reader, self._topology, claims.run_id, self._rejected())
            sent = completions.deliver(token, outcome, body, error, idempotency_key)
            return watch.wait(admin, self._group, sent, deadline)
        finally:
            reader.close()
            admin.close()

    def signal(
        self,
        name: str,
        value: Any = None,
        *,
        run_id: str | None = None,
        key: str | None = None,
        correlation: Mapping[str, str] | None = None,
        event_id: str | None = None,
    ) -> SentEvent:
        """Send the event ``name`` with the payload ``value`` to the run ``run_id``, or by
        correlation ``key`` to every run waiting on it (``Pipeline.await_event``). The
        same ``event_id`` twice is admitted once (default: a fresh id). Raises ValueError
        for a bad address or correlation, ``PayloadTooLarge`` over the payload limit."""
        event = build_event(
            name,
            value,
            run_id=run_id,
            key=key,
            correlation=correlation,
            event_id=event_id,
            max_payload_bytes=self._max_payload_bytes,
            sent_ms=int(time.time() * 1000),
        )
        if self._producer is None:
            if self._deployment is not None:
                ensure_topics(self._deployment)
            self._producer = self._transport.producer()
        return send_event(self._producer, self._topology, event)

    def completion(self, run_id: str, idempotency_key: str) -> CompletionReceipt | None:
        """What became of a completion of ``run_id`` carrying ``idempotency_key``, asked
        later (sent without waiting, or by another producer): ``admission`` ``admitted``
        (with the admitted fact's ``seq``) or ``refused`` (with ``refusal`` and ``detail``),
        where the completion decided on was written, and when (``decided_ms``). An
        admission wins over a refusal of the same key (a later, conflicting copy). None:
        nothing decided on such a completion (yet).
        """
        facts = self.history(run_id)
        rejected = TopicPartition(
            self._topology.name(TopicName.REJECTED),
            partition_for(run_id.encode(), self._rejected()),
        )
        reader = self._transport.reader()
        try:
            return find_completion(facts, reader, rejected, run_id, idempotency_key)
        finally:
            reader.close()

    def _rejected(self) -> int:
        """The partition count of admission.rejected (not co-partitioned: asked once)."""
        if self._rejected_partitions is None:
            admin = self._transport.admin()
            try:
                spec = admin.describe_topics().get(self._topology.name(TopicName.REJECTED))
            finally:
                admin.close()
            self._rejected_partitions = (
                self._topology.partitions if spec is None else spec.partitions
            )
        return self._rejected_partitions

    def _completion_client(self) -> CompletionClient:
        if self._completions is None:
            if self._deployment is not None:
                ensure_topics(self._deployment)
            self._completions = CompletionClient(
                self._transport, self._topology, max_payload_bytes=self._max_payload_bytes
            )
        return self._completions

    def cancel(self, run_id: str, reason: str = "", *, wait_s: float = 30.0) -> CommandReply | None:
        """Request cancellation: stop intent commits once; the first stop reason wins."""
        command = CancelRun(
            command_id=str(uuid.uuid4()), run_id=run_id, reason=reason, requested_ms=wall_clock_ms()
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

    def redrive(
        self,
        run_id: str,
        from_step: int | None = None,
        *,
        operator: str = "",
        reason: str = "",
        command_id: str | None = None,
        wait_s: float = 30.0,
    ) -> CommandReply | None:
        """Give a failed run a new attempt from its failed step (or ``from_step``, a step
        index from 0 to the failed step); refused with a reason for a run that is not
        failed. Sending the same ``command_id`` again redrives once and gets the same
        response (``created`` false the second time). ValueError for a ``from_step``
        below 0 or over 2**31 - 1, sending nothing."""
        check_step_index(from_step)
        command = RedriveRun(
            command_id=command_id or str(uuid.uuid4()),
            run_id=run_id,
            from_step=from_step,
            operator=operator,
            reason=reason,
            requested_ms=wall_clock_ms(),
        )
        return self.request(command, wait_s)

    def release(
        self, run_id: str, *, operator: str = "", reason: str = "", wait_s: float = 30.0
    ) -> CommandReply | None:
        """Release a quarantined run (a decision about it raised; deploy the fix first):
        its timers fire and its inputs are decided again. Refused with a reason
        (not_quarantined, unknown_run) otherwise."""
        command = ReleaseRun(
            command_id=str(uuid.uuid4()),
            run_id=run_id,
            operator=operator,
            reason=reason,
            requested_ms=wall_clock_ms(),
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
        """The run's projection as of the end of runs.facts; None if there is no such run."""
        return self.current(run_id).state

    def history(self, run_id: str) -> list[FactHeader]:
        """The run's facts in order, up to the end of runs.facts ([] if there is no such run)."""
        return decode_facts(self.current(run_id).history)

    def wait(self, run_id: str, timeout_s: float = 30.0) -> RunResult:
        """Wait until the run ends and return how: succeeded (with its output), failed,
        cancelled or timed out (with the error).

        Raises:
            UnknownRunError: runs.facts has no fact of this run (yet).
            WaitTimeoutError: the run did not end within ``timeout_s`` (it goes on).
        """
        deadline = time.monotonic() + timeout_s
        read = self._read_run(run_id)
        if not read.view.history:
            raise UnknownRunError(run_id)
        ended = terminal_result(decode_facts(read.view.history))
        if ended is not None:
            return ended
        key = run_id.encode()

        def ending(record: Record) -> RunResult | None:
            if record.key != key or record.value is None:
                return None
            return terminal_result([decode_fact(record.value)])

        reader = self._transport.reader()
        try:
            ended = _follow(reader, read.facts, read.next_offset, deadline, ending)
        finally:
            reader.close()
        if ended is None:
            state = self.status(run_id)
            raise WaitTimeoutError(run_id, timeout_s, state.status if state else "unknown")
        return ended

    def stored_status(self, run_id: str) -> RunState | None:
        """The run's projection in the local store only (None: not there)."""
        store = self._store(run_id)
        if store is None:
            return None
        try:
            return store.run(run_id)
        finally:
            store.close()

    def stored_history(self, run_id: str) -> list[FactHeader]:
        """The run's facts in the local store only ([]: not there)."""
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
        return self._read_run(run_id).view

    def _read_run(self, run_id: str) -> _RunRead:
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
        tail: list[bytes] = []
        end = start
        try:
            for batch in reader.read(facts, start):
                end = batch[-1].offset + 1
                tail.extend(r.value for r in batch if r.key == key and r.value is not None)
        finally:
            reader.close()
        view = RunView(fold(decode_facts(tail), state), history + tail, len(tail))
        return _RunRead(view, facts, end)

    def close(self) -> None:
        """Close the producers (sent commands and completions are flushed first)."""
        if self._producer is not None:
            self._producer.close()
            self._producer = None
        if self._completions is not None:
            self._completions.close()
            self._completions = None


def _await_reply(
    reader: Reader, replies: TopicPartition, start: int, command_id: str, wait_s: float
) -> CommandReply | None:
    def reply_to(record: Record) -> CommandReply | None:
        reply = codec().decode_as(record.value, CommandReply)
        return reply if reply.command_id == command_id else None

    return _follow(reader, replies, start, time.monotonic() + wait_s, reply_to)


def _follow(
    reader: Reader,
    tp: TopicPartition,
    start: int,
    deadline: float,
    pick: Callable[[Record], T | None],
) -> T | None:
    """Read ``tp`` from ``start`` as records are committed until ``pick`` returns something
    for one of them (that is returned) or the ``time.monotonic()`` deadline passes (None)."""
    position = start

    def attempt() -> T | None:
        nonlocal position
        for records in reader.read(tp, position):
            for record in records:
                position = record.offset + 1
                found = pick(record)
                if found is not None:
                    return found
        return None

    return poll_until(attempt, deadline)


def _graph(state: RunState) -> dict[str, Any] | None:
    """A graph run's steps and the lanes of those in flight (None for a chain): each
    lane's attempt, wait and Unknown attempt, as ``status`` shows a chain's."""
    if not state.graph:
        return None
    steps = {
        str(step): {"status": node.status, "reason": node.reason, "segment": node.segment}
        for step, node in sorted(state.nodes.items())
    }
    lanes = {}
    for segment in sorted(state.lanes):
        view = state.lane_view(segment)
        lanes[str(segment)] = {
            "phase": view.phase,
            "next_step": view.attempt.next_step,
            "attempt": view.attempt.number,
            "generation": view.attempt.generation,
            **{key: shown for key, shown in waits.status_views(view).items() if shown},
            "unknown_attempt": view.unknown.model_dump() if view.unknown else None,
        }
    return {"steps": steps, "lanes": lanes}


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
        "retry_reason": state.attempt.retry_reason,
        "phase": state.phase,
        "segment": state.attempt.segment,
        "attempt": state.attempt.number,
        "generation": state.attempt.generation,
        "next_step": state.attempt.next_step,
        # Attempts the step at next_step has used of its retry budget, and attempts the
        # run lost to the infrastructure (not charged to any budget).
        "step_attempts": state.attempt.step_attempts,
        "infrastructure_losses": state.infrastructure_losses,
        "started": _started(state),
        "timers": [{"kind": e.kind, "due_ms": e.due_ms} for e in sorted(due_entries(state))],
        **waits.status_views(state),  # what the run waits for: "waiting", "sleeping"...
        "publications": dict(state.publication.targets),
        "deadline_ms": state.deadline_ms,
        "stop_reason": state.stop.reason,
        "stop_detail": state.stop.detail,
        "execution": state.execution,
        "recovery": state.recovery,
        "redrives": len(state.redrives),
        # Set while a decision about the run raised: processor release, once fixed.
        "quarantine": state.quarantine.model_dump() if state.quarantine else None,
        "unknown_attempt": state.unknown.model_dump() if state.unknown else None,
        "compensation": _compensation(state),
        "graph": _graph(state),
        "parent": children.parent_of(state),  # a child run's parent (model/children.py)
        "children": children.children_of(state),
        # The schedule whose fire started the run (model/schedule_link.py), if any.
        "schedule": state.schedule.model_dump() if state.schedule else None,
        "version": state.version,
        "created_ms": state.created_ms,
        "updated_ms": state.updated_ms,
    }


def _started(state: RunState) -> dict[str, Any] | None:
    """The step a worker reported started in the running attempt (forward or compensator),
    and by whom."""
    attempt = state.running_attempt()
    if attempt is None or attempt.started_step is None:
        return None
    return {
        "kind": attempt.kind,
        "step": attempt.started_step,
        "worker_id": attempt.worker_id,
        "expires_ms": attempt.expires_ms,
        "heartbeat_due_ms": attempt.heartbeat_due_ms,
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
        "retry_reason": state.compensation.retry_reason,
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
