"""Driving one processor loop by hand for the run-control tests (a helper module: no tests).

``Control`` wraps a ``LoopHarness``: it plays the worker for chosen work items,
sends commands to runs.commands and completions to boundary.completions, and
finds the processor's answers (runs.replies, admission.rejected) and the facts.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from processor.clients.client import Client, new_submit
from processor.facts.models import (
    AttemptProgress,
    BoundaryCompletion,
    BoundaryRequest,
    CancelRun,
    CommandReply,
    FactHeader,
    RedriveRun,
    Rejected,
    ResolveAttempt,
    SegmentResult,
    WorkItem,
)
from processor.facts.topics import TopicName
from processor.model.due import DueEntry
from processor.model.state import RunState
from processor.store.rocks import PartitionStore
from processor.transport.base import Record
from processor.transport.partitioner import partition_for
from processor.worker.executor import execute
from processor.worker.pipeline import Application
from tests.apps.support import FakeClock, LoopHarness, TopicTail, decode_records, transport_settings

__all__ = ["SECRET", "Control", "Work", "own_loops", "shared_loop", "timers_held"]

SECRET = b"control-tests-secret-0123456789"

#: ``start(previous=None)``: a loop of the test's own (see ``own_loops``).
StartLoop = Callable[["Control | None"], "Control"]


def shared_loop(app: Application, kind: str, path: Path) -> Iterator[LoopHarness]:
    """The body of a module's ``shared`` fixture: one loop of ``app`` for its tests."""
    settings = transport_settings(kind, path)
    h = LoopHarness(settings.data_dir, app, FakeClock(), settings=settings, secret=SECRET)
    try:
        yield h
    finally:
        h.close()


def own_loops(app: Application, kind: str, path: Path) -> Iterator[StartLoop]:
    """The body of a ``start`` fixture: start a loop of ``app`` of the test's own on
    fresh topics; given the previous Control, restart it.

    A restarted loop (closed, then opened on the same data dir, topics and group)
    keeps the fake clock and the work items already dispatched.
    """
    settings = transport_settings(kind, path)
    opened: list[Control] = []

    def start(previous: Control | None = None) -> Control:
        clock = FakeClock()
        if previous is not None:
            previous.close()
            clock = previous.h.clock
        h = LoopHarness(settings.data_dir, app, clock, settings=settings, secret=SECRET)
        control = Control(h, previous, owned=True)
        opened.append(control)
        return control

    try:
        yield start
    finally:
        for control in opened:
            control.close()


F = TypeVar("F", bound=FactHeader)
Work = tuple[str, str, int, int]  # run, kind, segment, generation: one work item


@contextmanager
def timers_held(h: LoopHarness) -> Iterator[None]:
    """Hold the loop's due-timer scan, so inputs are decided before any timer fires.

    On Kafka a record produced before ``run_once`` may arrive a round later, after a
    due timer already fired; holding the scan makes "the input first" deterministic
    on both transports. The scan resumes (in the next round) when the block exits.
    """
    h.loop.hold_timers(True)
    try:
        yield
    finally:
        h.loop.hold_timers(False)


class Control:
    """A harness plus the views and inputs the run-control tests need."""

    def __init__(
        self, h: LoopHarness, previous: Control | None = None, *, owned: bool = False
    ) -> None:
        self.h = h
        partitions = h.deployment.topology.partitions
        self._replies = TopicTail(h.reader, h.name(TopicName.REPLIES), partitions, from_end=True)
        self._requests = TopicTail(
            h.reader, h.name(TopicName.REQUESTS), partitions, from_end=previous is None
        )
        self.replies: list[CommandReply] = []
        self.requests: list[BoundaryRequest] = []
        # A restarted harness reads segments.work from the start: skip what was seen.
        self.pending: list[WorkItem] = list(previous.pending) if previous is not None else []
        self.seen: set[Work] = set(previous.seen) if previous is not None else set()
        self._owned = owned  # close the harness with this view

    def close(self) -> None:
        if self._owned:
            self._owned = False
            self.h.close()

    # --- time and rounds ---------------------------------------------------------------

    @property
    def now(self) -> int:
        return self.h.clock()

    def advance_to(self, when_ms: int) -> None:
        self.h.clock.advance_to(when_ms)

    def settle(self, rounds: int = 8) -> None:
        """Run a few rounds, each with a timer scan at the current fake time.

        Used only before asserting that nothing happens (no retry, no timeout): the
        durable due rows are checked as well, so this is not the only evidence.
        """
        for _ in range(rounds):
            self.h.loop._next_timer_scan = 0.0
            self.h.loop.run_once()

    def drive(self, condition: Any, what: str) -> Any:
        return self.h.drive(condition, what)

    # --- runs and facts ----------------------------------------------------------------

    def submit(self, pipeline: str, value: Any, *, deadline_ms: int | None = None) -> str:
        command = new_submit(pipeline, value, deadline_ms=deadline_ms)
        self.h.produce_model(TopicName.COMMANDS, command.run_id, command)
        self.drive(lambda: self.h.loop_state(command.run_id) is not None, "the run was accepted")
        return command.run_id

    def state(self, run_id: str) -> RunState:
        state = self.h.loop_state(run_id)
        assert state is not None, f"no run {run_id}"
        return state

    def facts(self, run_id: str) -> list[FactHeader]:
        return self.h.facts(run_id)

    def types(self, run_id: str) -> list[str]:
        return self.h.fact_types(run_id)

    def of(self, run_id: str, kind: type[F]) -> list[F]:
        return [f for f in self.facts(run_id) if isinstance(f, kind)]

    def one(self, run_id: str, kind: type[F]) -> F:
        found = self.of(run_id, kind)
        assert len(found) == 1, f"expected one {kind.__name__}, got {found}"
        return found[0]

    def wait_for(self, run_id: str, kind: type[F], count: int = 1) -> list[F]:
        """Drive until the run has ``count`` facts of ``kind``; return them."""
        return self.drive(
            lambda: (found := self.of(run_id, kind)) and len(found) >= count and found,
            f"{count} {kind.__name__} of {run_id}",
        )

    def terminal(self, run_id: str) -> RunState:
        """Drive (playing no worker) until the run is terminal."""
        return self.drive(
            lambda: (s := self.h.loop_state(run_id)) is not None and s.terminal and s,
            f"run {run_id} terminal",
        )

    def due(self, run_id: str) -> list[DueEntry]:
        """The run's durable due-work rows, read from its partition store."""
        deployment = self.h.deployment
        partition = partition_for(run_id.encode(), deployment.topology.partitions)
        path = deployment.settings.state_dir / f"p{partition:04d}"
        store = PartitionStore(path, read_only=True)
        try:
            return [e for e in store.due(2**62, 1_000_000) if e.run_id == run_id]
        finally:
            store.close()

    def client(self) -> Client:
        deployment = self.h.deployment
        return Client(deployment.transport, deployment.topology, deployment.settings.state_dir)

    # --- the worker's part -------------------------------------------------------------

    def _collect(self) -> None:
        for item in self.h.new_work():
            identity = (item.run_id, item.kind, item.segment, item.generation)
            if identity not in self.seen:
                self.seen.add(identity)
                self.pending.append(item)

    def _take(self, run_id: str, kind: str) -> WorkItem | None:
        self._collect()
        for index, item in enumerate(self.pending):
            if item.run_id == run_id and item.kind == kind:
                return self.pending.pop(index)
        return None

    def work(self, run_id: str, kind: str = "forward") -> WorkItem:
        """Drive until a new work item of ``kind`` for the run is dispatched; take it."""
        return self.drive(lambda: self._take(run_id, kind), f"a {kind} work item of {run_id}")

    def no_new_work(self, run_id: str) -> bool:
        self._collect()
        return not any(item.run_id == run_id for item in self.pending)

    def result(self, item: WorkItem) -> tuple[SegmentResult, Record]:
        """Run the item's steps (or compensator) here, as a worker would; produce the result."""
        result = execute(item, self.h.app, "test-worker")
        return result, self.h.produce_model(TopicName.RESULTS, item.run_id, result)

    def complete(self, item: WorkItem) -> SegmentResult:
        """Produce the item's result and drive until the loop consumed it."""
        result, record = self.result(item)
        self.consumed(record)
        return result

    def consumed(self, record: Record) -> None:
        """Drive until the run's facts or a rejection show that ``record`` was decided."""
        run_id = (record.key or b"").decode()
        start = self.facts_count(run_id)
        self.drive(
            lambda: self.facts_count(run_id) > start or self.h.rejected.find(record) is not None,
            f"{record.topic}@{record.offset} to be decided",
        )

    def report(
        self,
        item: WorkItem,
        report: str = "started",
        *,
        step: int | None = None,
        worker: str = "test-worker",
    ) -> Record:
        """Produce a worker's progress report on ``item`` (its first step by default)."""
        progress = AttemptProgress(
            run_id=item.run_id,
            kind=item.kind,
            segment=item.segment,
            attempt=item.attempt,
            generation=item.generation,
            step=item.first_step if step is None else step,
            report=report,  # type: ignore[arg-type]
            worker_id=worker,
            at_ms=self.now,
        )
        return self.h.produce_model(TopicName.RESULTS, item.run_id, progress)

    def started(
        self, item: WorkItem, *, step: int | None = None, worker: str = "test-worker"
    ) -> int:
        """Report ``item``'s step (or compensator) started and drive until it is recorded:
        its new expiry."""
        self.report(item, step=step, worker=worker)
        first = item.first_step if step is None else step

        def recorded() -> int | None:
            attempt = self.state(item.run_id).running_attempt()
            if attempt is None or attempt.kind != item.kind:
                return None
            mine = (attempt.generation, attempt.started_step, attempt.worker_id)
            return attempt.expires_ms if mine == (item.generation, first, worker) else None

        return int(self.drive(recorded, f"step {first} of {item.run_id} started"))

    def facts_count(self, run_id: str) -> int:
        state = self.h.loop_state(run_id)
        return 0 if state is None else state.version

    def play(self, run_id: str) -> RunState:
        """Play the worker for every item of the run until it is terminal."""

        def step() -> RunState | None:
            self._collect()
            mine = [item for item in self.pending if item.run_id == run_id]
            for item in mine:
                self.pending.remove(item)
                self.result(item)
            state = self.h.loop_state(run_id)
            return state if state is not None and state.terminal else None

        return self.drive(step, f"run {run_id} terminal")

    def play_timed(self, run_id: str, until: Any, what: str, step_ms: int = 50) -> Any:
        """Play the worker for the run's items, moving the fake clock on by ``step_ms``
        each round (so retry backoffs pass), until ``until()`` holds."""

        def step() -> Any:
            self._collect()
            for item in [i for i in self.pending if i.run_id == run_id]:
                self.pending.remove(item)
                self.result(item)
            self.advance_to(self.now + step_ms)
            return until()

        return self.drive(step, what)

    def submit_many(self, runs: list[tuple[str, Any]]) -> list[str]:
        """Submit (pipeline, input) pairs in one flush; return their run ids, not waiting."""
        commands = [new_submit(pipeline, value) for pipeline, value in runs]
        for command in commands:
            self.h.produce_model(TopicName.COMMANDS, command.run_id, command, flush=False)
        self.h.producer.flush()
        return [command.run_id for command in commands]

    def play_all(self, run_ids: list[str], until: Any, what: str) -> Any:
        """Play the worker for every item of these runs until ``until()`` holds."""
        wanted = set(run_ids)

        def step() -> Any:
            self._collect()
            mine = [item for item in self.pending if item.run_id in wanted]
            for item in mine:
                self.pending.remove(item)
                result = execute(item, self.h.app, "test-worker")
                self.h.produce_model(TopicName.RESULTS, item.run_id, result, flush=False)
            if mine:
                self.h.producer.flush()
            return until()

        return self.drive(step, what)

    def until_suspended(self, run_id: str) -> BoundaryRequest:
        """Play the worker until the run waits at its await; return the (first) request."""
        self.complete(self.work(run_id))
        self.drive(lambda: self.h.suspended(run_id), f"run {run_id} suspended")
        return self.request(run_id)

    # --- boundary requests and completions ---------------------------------------------

    def requests_of(self, run_id: str, *, refresh: bool = True) -> list[BoundaryRequest]:
        """The boundary requests of the run dispatched so far (no driving; cancel
        notices are ``cancel_notices_of``)."""
        if refresh:
            self.requests.extend(decode_records(self._requests.new(), BoundaryRequest))
        return sorted(
            (r for r in self.requests if r.run_id == run_id and r.cancel is None),
            key=lambda r: (r.boundary, r.item_index),
        )

    def cancel_notices_of(self, run_id: str) -> list[BoundaryRequest]:
        """The cancel notices of the run's interactions on boundary.requests so far."""
        self.requests_of(run_id)
        return sorted(
            (r for r in self.requests if r.run_id == run_id and r.cancel is not None),
            key=lambda r: (r.boundary, r.item_index),
        )

    def request(self, run_id: str) -> BoundaryRequest:
        """Drive until the run's first boundary request is on boundary.requests."""
        return self.drive(
            lambda: next(iter(self.requests_of(run_id)), None), f"a boundary request of {run_id}"
        )

    def complete_interaction(
        self, request: BoundaryRequest, value: Any, *, key: str | None = None
    ) -> Record:
        completion = BoundaryCompletion(
            token=request.resume_token,
            idempotency_key=key or f"k-{request.run_id}-{request.interaction}",
            outcome="success",
            payload=json.dumps(value).encode(),
        )
        return self.h.produce_model(TopicName.COMPLETIONS, request.run_id, completion)

    # --- commands and answers ----------------------------------------------------------

    def cancel(self, run_id: str, reason: str = "operator asked") -> tuple[CancelRun, Record]:
        command = CancelRun(
            command_id=str(uuid.uuid4()), run_id=run_id, reason=reason, requested_ms=self.now
        )
        return command, self.h.produce_model(TopicName.COMMANDS, run_id, command)

    def resolve(
        self,
        run_id: str,
        action: str,
        *,
        key: str,
        output: Any = None,
        error: str | None = None,
        generation: int | None = None,
        kind: str = "forward",
    ) -> tuple[ResolveAttempt, Record]:
        """A ResolveAttempt naming the run's Unknown attempt (or ``generation`` instead)."""
        unknown = self.state(run_id).unknown
        named = (unknown.segment, unknown.attempt, unknown.generation) if unknown else (1, 1, 1)
        command = ResolveAttempt(
            command_id=str(uuid.uuid4()),
            run_id=run_id,
            kind=kind,
            segment=named[0],
            attempt=named[1],
            generation=named[2] if generation is None else generation,
            idempotency_key=key,
            action=action,
            output=json.dumps(output).encode() if action == "succeed" else None,
            error=error,
        )
        return command, self.h.produce_model(TopicName.COMMANDS, run_id, command)

    def reply(self, command: CancelRun | ResolveAttempt | RedriveRun) -> CommandReply:
        """Drive until the processor's reply to ``command`` is on runs.replies."""
        return self.replies_to(command, 1)[0]

    def replies_to(
        self, command: CancelRun | ResolveAttempt | RedriveRun, count: int
    ) -> list[CommandReply]:
        """Drive until ``count`` replies to ``command`` are on runs.replies; return them."""

        def find() -> list[CommandReply] | None:
            self.replies.extend(decode_records(self._replies.new(), CommandReply))
            found = [r for r in self.replies if r.command_id == command.command_id]
            return found if len(found) >= count else None

        what = f"{count} replies to {type(command).__name__} {command.command_id}"
        return self.drive(find, what)

    def redrive(
        self,
        run_id: str,
        from_step: int | None = None,
        *,
        command_id: str | None = None,
        operator: str = "",
        reason: str = "",
    ) -> tuple[RedriveRun, Record]:
        command = RedriveRun(
            command_id=command_id or str(uuid.uuid4()),
            run_id=run_id,
            from_step=from_step,
            operator=operator,
            reason=reason,
            requested_ms=self.now,
        )
        return command, self.h.produce_model(TopicName.COMMANDS, run_id, command)

    def rejection(self, record: Record) -> Rejected:
        """Drive until ``record`` is refused on admission.rejected; return the refusal."""
        return self.drive(lambda: self.h.rejected.find(record), f"a refusal of {record.offset}")

    def rejected_reasons(self, run_id: str) -> list[str]:
        return [r.reason for r in self.h.rejected.refresh() if r.run_id == run_id]
