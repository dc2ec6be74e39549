"""definition_blocked, pure: a run waits for a worker that loads its pinned version;
stop notices reach the running attempt and the outside systems of open interactions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

from processor.clients.client import new_submit
from processor.engine.fleet import Fleet
from processor.facts import json_wire
from processor.facts.codec import codec
from processor.facts.models import (
    BoundaryRequest,
    CancelRun,
    FactHeader,
    LoadedPipeline,
    RunDefinitionBlocked,
    RunStopped,
    SegmentAttemptStarted,
    SegmentResult,
    StepOutput,
    StopNotice,
    WorkerAnnouncement,
    WorkItem,
)
from processor.facts.topics import TopicName
from processor.model.decide import (
    Context,
    Decision,
    TimerFired,
    decide_cancel,
    decide_result,
    decide_submit,
    decide_timer,
    decide_unblock,
)
from processor.model.decision import LiveVersions
from processor.model.due import due_entries
from processor.model.listing import IndexEntry, index_entries
from processor.model.pipeline_spec import AwaitSpec, PipelineSpec, RetryPolicy, StepSpec
from processor.model.reduce import fold
from processor.model.state import RunState
from processor.store.census import blocked_runs
from processor.store.rocks import PartitionStore
from processor.transport.base import Outbound
from processor.transport.topology import Topology
from processor.worker.announce import Announcer
from processor.worker.pipeline import Pipeline
from tests.apps.support import wait_until
from tests.apps.version_pipelines import application

RETRY = RetryPolicy(max_attempts=2, initial_backoff_ms=10)
V1 = PipelineSpec("greet", 1, (StepSpec("hello", RETRY, 1_000), StepSpec("bye", RETRY, 1_000)))
V2 = PipelineSpec("greet", 2, (StepSpec("hello", RETRY, 1_000),))
ASKING = PipelineSpec(
    "asking",
    1,
    (StepSpec("ask", awaits=AwaitSpec("svc", 5_000, itemized=True, wire="json")), StepSpec("end")),
)


def _fork() -> PipelineSpec:
    """A graph: ``begin``, then ``left`` and ``right`` in lanes of their own, ``join``."""
    fork = Pipeline("fork")
    for name, needs in (("begin", None), ("left", ["begin"]), ("right", ["begin"])):
        fork.step(name, needs=needs)(lambda v: v)
    fork.step("join", needs=["left", "right"])(lambda v: v)
    return fork.spec()


FORK = _fork()
ONLY_V1: LiveVersions = frozenset({("greet", 1), ("asking", 1)})
BOTH: LiveVersions = ONLY_V1 | {("greet", 2)}


class Catalog:
    """Pins new ``greet`` runs to v2 (its latest)."""

    specs: ClassVar[dict[tuple[str, int], PipelineSpec]] = {
        (s.name, s.version): s for s in (V1, V2, ASKING, FORK)
    }

    def latest(self, name: str) -> PipelineSpec | None:
        return max((s for (n, _), s in self.specs.items() if n == name), key=lambda s: s.version)

    def get(self, name: str, version: int) -> PipelineSpec | None:
        return self.specs.get((name, version))


class Run:
    def __init__(
        self, live: LiveVersions | None, pipeline: str = "greet", deadline_in: int | None = None
    ) -> None:
        self.now = 100_000
        self.live = live
        self.facts: list[FactHeader] = []
        self.emitted: list[tuple[TopicName, object, str]] = []
        deadline = None if deadline_in is None else self.now + deadline_in
        command = new_submit(pipeline, {"n": 1}, deadline_ms=deadline)
        self.run_id = command.run_id
        self.take(decide_submit(command, None, self.ctx))

    @property
    def ctx(self) -> Context:
        return Context(Catalog(), self.now, live_versions=self.live)

    @property
    def state(self) -> RunState:
        state = fold(self.facts)
        assert state is not None
        return state

    def take(self, decision: Decision) -> Decision:
        assert decision.refusal is None, decision.detail
        self.facts.extend(decision.facts)
        self.emitted.extend((e.topic, e.value, e.wire) for e in decision.emits)
        return decision

    def of(self, kind: type) -> list[object]:
        return [value for _, value, _ in self.emitted if isinstance(value, kind)]

    @property
    def work(self) -> list[WorkItem]:
        return [w for w in self.of(WorkItem) if isinstance(w, WorkItem)]

    def answer(self, item: WorkItem, **fields: object) -> Decision:
        result = SegmentResult(
            result_id=f"r{len(self.facts)}",
            run_id=self.run_id,
            segment=item.segment,
            attempt=item.attempt,
            generation=item.generation,
            steps=(),
            outcome="failed",
            failed_step=item.first_step,
            error="pipeline 'greet' v2 is not loaded here",
            error_type="UnknownPipeline",
            retryable=True,
            worker_id="old-worker",
        )
        return self.take(decide_result(result.model_copy(update=fields), self.state, self.ctx))

    def advance(self, to: int) -> None:
        self.now = to
        for entry in sorted(due_entries(self.state)):
            if entry.due_ms <= self.now:
                self.take(decide_timer(TimerFired(entry), self.state, self.ctx))

    def cancel(self) -> Decision:
        command = CancelRun(command_id="c", run_id=self.run_id, reason="user", requested_ms=1)
        return self.take(decide_cancel(command, self.state, self.ctx))


def test_a_run_no_live_worker_can_run_waits_blocked_and_undispatched() -> None:
    run = Run(ONLY_V1)
    state = run.state
    assert (state.pipeline_version, state.status) == (2, "running")
    assert state.phase == "definition_blocked"
    assert run.work == []
    blocked = [f for f in run.facts if isinstance(f, RunDefinitionBlocked)]
    assert [(b.reason, b.attempt, b.generation, b.step_attempts) for b in blocked] == [
        ("no_live_worker", 1, 1, 0)
    ]
    assert due_entries(state) == frozenset()  # no attempt timer: nothing runs
    rows = {(e.kind, e.parts) for e in index_entries(state)}
    assert ("blocked", ("greet", "2")) in rows
    # Nothing changes while still no live worker loads v2.
    assert decide_unblock(state, run.ctx) == Decision()


def test_a_blocked_run_is_dispatched_once_a_worker_loads_its_version() -> None:
    run = Run(ONLY_V1)
    run.live = BOTH
    run.take(decide_unblock(run.state, run.ctx))
    started = [f for f in run.facts if isinstance(f, SegmentAttemptStarted)]
    assert [(s.attempt, s.generation) for s in started] == [(1, 1)]
    assert [(w.pipeline_version, w.attempt) for w in run.work] == [(2, 1)]
    state = run.state
    assert (state.phase, state.attempt.step_attempts) == ("dispatched", 1)
    assert not any(e.kind == "blocked" for e in index_entries(state))
    assert decide_unblock(state, run.ctx) == Decision()  # only a blocked run is woken


def test_unknown_fleet_dispatches_every_version() -> None:
    run = Run(None)
    assert run.state.phase == "dispatched"
    assert [w.pipeline_version for w in run.work] == [2]


def test_a_worker_without_the_version_charges_no_retry_and_blocks_the_run() -> None:
    run = Run(None)  # warming up: dispatched to whoever owns the partition
    for round_ in range(5):  # more answers than the retry policy's two attempts
        run.answer(run.work[-1])
        state = run.state
        assert state.phase == "definition_blocked"
        assert (state.attempt.number, state.attempt.step_attempts) == (1, 0)
        assert state.status == "running"
        run.take(decide_unblock(state, run.ctx))
        assert run.work[-1].generation == round_ + 2  # a new fence each time
    blocked = [f for f in run.facts if isinstance(f, RunDefinitionBlocked)]
    assert {(b.reason, b.worker_id) for b in blocked} == {("worker_lacks_version", "old-worker")}
    item = run.work[-1]
    done = SegmentResult(
        result_id="ok",
        run_id=run.run_id,
        segment=item.segment,
        attempt=item.attempt,
        generation=item.generation,
        steps=(StepOutput(step=0, output=b'{"ran":2}'),),
        outcome="completed",
        worker_id="new-worker",
    )
    run.take(decide_result(done, run.state, run.ctx))
    assert run.state.phase == "publishing" or run.state.status == "succeeded"


def _completed(run: Run, item: WorkItem, output: bytes) -> Decision:
    result = SegmentResult(
        result_id=f"ok{len(run.facts)}",
        run_id=run.run_id,
        segment=item.segment,
        attempt=item.attempt,
        generation=item.generation,
        steps=(StepOutput(step=item.first_step, output=output),),
        outcome="completed",
        worker_id="new-worker",
    )
    return run.take(decide_result(result, run.state, run.ctx))


def test_a_graph_lane_a_worker_cannot_run_blocks_alone_and_is_dispatched_again() -> None:
    """``left`` and ``right`` run in lanes of their own; a worker without the version
    answers ``left``: that lane alone is blocked (no retry charged) while ``right``
    completes; once a worker loads the version, only the blocked lane is dispatched
    again, and the join runs after both."""
    run = Run(None, pipeline="fork")  # warming up: dispatched to whoever owns it
    _completed(run, run.work[-1], b'{"n":1}')
    left, right = run.work[1:]
    assert (left.first_step, right.first_step) == (1, 2)
    run.answer(left)
    _completed(run, right, b'"right"')
    state = run.state
    blocked = [lane for lane in state.lane_views() if lane.phase == "definition_blocked"]
    assert [(b.attempt.segment, b.attempt.step_attempts) for b in blocked] == [(left.segment, 0)]
    assert state.status == "running" and len(run.work) == 3  # join waits for left
    assert ("blocked", ("fork", "1")) in {(e.kind, e.parts) for e in index_entries(state)}
    run.live = ONLY_V1  # still no worker loads fork v1
    assert decide_unblock(state, run.ctx) == Decision()

    run.live = ONLY_V1 | {("fork", 1)}
    run.take(decide_unblock(state, run.ctx))
    again = run.work[3:]
    assert [(w.segment, w.attempt, w.generation) for w in again] == [
        (left.segment, 1, left.generation + 1)
    ]
    assert not any(e.kind == "blocked" for e in index_entries(run.state))
    assert decide_unblock(run.state, run.ctx) == Decision()  # nothing blocked any more
    _completed(run, again[0], b'"left"')
    (join,) = run.work[4:]
    assert json.loads(join.input) == {"left": "left", "right": "right"}
    _completed(run, join, b'"joined"')
    assert run.state.status == "succeeded"
    blocked_facts = [f for f in run.facts if isinstance(f, RunDefinitionBlocked)]
    assert [(f.reason, f.segment) for f in blocked_facts] == [
        ("worker_lacks_version", left.segment)
    ]


def test_a_stale_unknown_pipeline_answer_is_refused() -> None:
    run = Run(None)
    first = run.work[-1]
    run.answer(first)
    run.take(decide_unblock(run.state, run.ctx))
    result = SegmentResult(
        result_id="late",
        run_id=run.run_id,
        segment=first.segment,
        attempt=first.attempt,
        generation=first.generation,
        steps=(),
        outcome="failed",
        error_type="UnknownPipeline",
        worker_id="w",
    )
    assert decide_result(result, run.state, run.ctx).refusal == "stale_attempt"


def test_a_blocked_run_can_be_cancelled_and_times_out_at_its_deadline() -> None:
    cancelled = Run(ONLY_V1)
    cancelled.cancel()
    assert cancelled.state.status == "cancelled"
    assert cancelled.of(StopNotice) == []  # nothing ran
    assert not any(e.kind == "blocked" for e in index_entries(cancelled.state))
    late = Run(ONLY_V1, deadline_in=1_000)
    late.advance(101_000)
    assert late.state.status == "timed_out"
    assert isinstance(late.facts[-1], RunStopped)


def test_a_stop_while_an_attempt_runs_sends_it_a_stop_notice() -> None:
    run = Run(BOTH)
    item = run.work[-1]
    run.cancel()
    notices = run.of(StopNotice)
    assert notices == [
        StopNotice(
            run_id=run.run_id,
            segment=item.segment,
            attempt=item.attempt,
            generation=item.generation,
            reason="cancelled",
            at_ms=run.now,
        )
    ]
    topics = [t for t, v, _ in run.emitted if isinstance(v, StopNotice)]
    assert topics == [TopicName.CONTROL]


def test_the_run_deadline_while_an_attempt_runs_sends_a_timed_out_notice() -> None:
    run = Run(BOTH, deadline_in=500)
    run.advance(100_500)
    assert [n.reason for n in run.of(StopNotice) if isinstance(n, StopNotice)] == ["timed_out"]


def test_a_stop_at_an_await_sends_a_cancel_notice_for_each_open_interaction() -> None:
    run = Run(BOTH, pipeline="asking")
    item = run.work[-1]
    suspended = SegmentResult(
        result_id="s",
        run_id=run.run_id,
        segment=item.segment,
        attempt=item.attempt,
        generation=item.generation,
        steps=(),
        outcome="suspended",
        requests=(b'{"q":1}', b'{"q":2}'),
        worker_id="w",
    )
    run.take(decide_result(suspended, run.state, run.ctx))
    requests = [(v, w) for t, v, w in run.emitted if isinstance(v, BoundaryRequest)]
    assert [r.cancel for r, _ in requests] == [None, None]
    run.cancel()
    notices = [(v, w) for t, v, w in run.emitted if isinstance(v, BoundaryRequest)][2:]
    assert [(n.interaction, n.item_index, n.cancel, w) for n, w in notices] == [
        (r.interaction, r.item_index, "cancelled", "json") for r, _ in requests
    ]
    assert all(n.request == b"" and n.resume_token == "" for n, _ in notices)
    assert run.of(StopNotice) == []  # nothing was running
    document = json.loads(json_wire.encode_request(notices[0][0]))
    assert (document["cancel"], document["request"], document["resume_token"]) == (
        "cancelled",
        None,
        "",
    )
    assert json_wire.decode_request(json_wire.encode_request(notices[0][0])) == notices[0][0]
    assert "cancel" not in json.loads(json_wire.encode_request(requests[0][0]))


# --- the processor's catalog of workers -----------------------------------------------------


def _announcement(worker: str, *versions: int, leaving: bool = False) -> WorkerAnnouncement:
    loaded = tuple(LoadedPipeline(name="greet", version=v) for v in versions)
    return WorkerAnnouncement(
        worker_id=worker, group="g", pipelines=loaded, concurrency=1, at_ms=0, leaving=leaving
    )


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def test_the_fleet_is_unknown_while_warming_up_and_until_a_worker_is_heard() -> None:
    clock = Clock(10_000)
    fleet = Fleet(1_000, clock)
    clock.now = 10_500
    assert fleet.live_versions() is None
    clock.now = 20_000
    assert fleet.live_versions() is None  # no announcement ever: older workers
    fleet.heard(_announcement("w1", 1))
    assert fleet.live_versions() == frozenset({("greet", 1)})
    clock.now = 10_000
    early = Fleet(1_000, clock)
    clock.now = 10_100
    early.heard(_announcement("w1", 1))
    clock.now = 10_999
    assert early.live_versions() is None  # another worker may not have spoken yet
    clock.now = 11_000
    assert early.live_versions() == frozenset({("greet", 1)})


def test_workers_come_leave_and_expire_and_each_change_is_reported_once() -> None:
    clock = Clock(0)
    fleet = Fleet(1_000, clock)
    clock.now = 2_000
    fleet.heard(_announcement("w1", 1))
    assert fleet.live_versions() == frozenset({("greet", 1)})
    assert fleet.take_change() and not fleet.take_change()
    clock.now = 2_500
    fleet.heard(_announcement("w1", 1))  # the same again: no change
    assert not fleet.take_change()
    clock.now = 2_600
    fleet.heard(_announcement("w2", 1, 2))
    assert fleet.live_versions() == frozenset({("greet", 1), ("greet", 2)})
    assert fleet.take_change()
    clock.now = 2_700
    fleet.heard(_announcement("w2", 1, 2, leaving=True))
    assert fleet.live_versions() == frozenset({("greet", 1)})
    assert fleet.take_change()
    for clock.now in range(3_000, 5_500, 500):  # the processor looks every round
        assert fleet.live_versions() == frozenset({("greet", 1)})  # heard at 2500
    clock.now = 5_501
    assert fleet.live_versions() == frozenset()  # not heard for three intervals
    assert fleet.take_change()


def test_time_the_processor_was_not_looking_does_not_expire_workers() -> None:
    clock = Clock(0)
    fleet = Fleet(1_000, clock)
    clock.now = 1_000
    fleet.heard(_announcement("w1", 1))
    assert fleet.live_versions() == frozenset({("greet", 1)})
    clock.now = 60_000  # a long restore: the worker's announcements wait in the topic
    assert fleet.live_versions() == frozenset({("greet", 1)})
    for clock.now in range(60_500, 63_001, 500):  # three intervals after the stall
        assert fleet.live_versions() == frozenset({("greet", 1)})
    clock.now = 63_001
    assert fleet.live_versions() == frozenset()  # now three intervals unheard


def test_the_fleet_measures_liveness_in_elapsed_time_not_the_processor_clock() -> None:
    fleet = Fleet(60_000)  # a monotonic clock: a test kit's jump of hours changes nothing
    fleet.heard(_announcement("w1", 1))
    assert "w1" in fleet.workers


def test_a_worker_announces_to_every_results_partition() -> None:
    now = [1_000]
    announcer = Announcer(
        application(1, 2),
        Topology(partitions=3),
        worker_id="w1",
        group="g",
        interval_ms=100,
        clock=lambda: now[0],
    )
    records = announcer.records()
    assert [r.partition for r in records] == [0, 1, 2]
    assert {r.topic for r in records} == {"segments.results"}
    sent = announcer.announcement(leaving=True)
    assert [(p.name, p.version) for p in sent.pipelines] == [("greet", 1), ("greet", 2)]
    assert sent.leaving and sent.worker_id == "w1" and sent.at_ms == 1_000


def test_blocked_runs_are_found_by_version_from_the_runs_index(tmp_path: Path) -> None:
    store = PartitionStore(tmp_path / "p0000")
    try:
        batch = store.batch()
        for index, version in enumerate((3, 3, 3, 2, 2, 10)):
            batch.put_index(IndexEntry("blocked", ("greet", str(version)), index, f"r{index}"))
        batch.put_index(IndexEntry("status", ("running",), 0, "r0"))
        store.write(batch)
        everything = blocked_runs(store, 100)
        versions = (3, 3, 3, 2, 2, 10)
        assert sorted(everything) == sorted(("greet", v, f"r{i}") for i, v in enumerate(versions))
        assert len(blocked_runs(store, 2)) == 2
        assert {r for _, _, r in blocked_runs(store, 2, {("greet", 3)})} < {"r0", "r1", "r2"}
        assert len(blocked_runs(store, 2, {("greet", 3)})) == 2
        both = blocked_runs(store, 5, {("greet", 2), ("greet", 10)})
        assert sorted(r for _, _, r in both) == ["r3", "r4", "r5"]
        assert blocked_runs(store, 5, set()) == []
    finally:
        store.close()


def test_announcing_runs_until_stopped_then_says_the_worker_leaves() -> None:
    import threading

    class Recording:
        def __init__(self) -> None:
            self.sent: list[Outbound] = []
            self.closed = False

        def produce(self, record: Outbound) -> None:
            self.sent.append(record)

        def flush(self, timeout_s: float = 30.0) -> None:
            pass

        def close(self) -> None:
            self.closed = True

    producer = Recording()
    stop = threading.Event()
    announcer = Announcer(
        application(1), Topology(partitions=2), worker_id="w", group="g", interval_ms=10
    )
    thread = threading.Thread(target=announcer.run, args=(producer, stop))
    thread.start()
    wait_until(lambda: len(producer.sent) >= 6, 10, "three rounds of announcements")
    stop.set()
    thread.join(10)
    decoded = [codec().decode_as(r.value, WorkerAnnouncement) for r in producer.sent]
    assert [a.leaving for a in decoded[-2:]] == [True, True]  # to both partitions
    assert not any(a.leaving for a in decoded[:-2])
    assert producer.closed
