"""A worker on each transport: concurrent attempts, progress reports, stop notices,
claims, and redelivery of what had not finished when it went away.

Work items are produced by the test (no processor), results read back from
segments.results. Waits are bounded by deadlines on conditions.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from processor import StepContext
from processor.facts import payload
from processor.facts.codec import decode, encode
from processor.facts.models import (
    AttemptProgress,
    ClaimReply,
    SegmentResult,
    StopNotice,
    WorkItem,
)
from processor.facts.topics import TopicName
from processor.transport.base import Outbound, TopicPartition, TopicSpec, Transport
from processor.transport.topology import Topology
from processor.worker.attempts import ref_of
from processor.worker.executor import NOT_RUN
from processor.worker.pipeline import Application, Pipeline
from processor.worker.service import Worker

WAIT_S = 30.0

# --- pipelines ---------------------------------------------------------------------------

together = Pipeline("together", version=1)
_arrived: list[str] = []


@together.step()
async def meet(value: dict[str, Any]) -> int:
    """Wait (on the loop) until ``value["n"]`` steps have arrived: only concurrent ones do."""
    _arrived.append(value["id"])
    deadline = time.monotonic() + 10
    while len(set(_arrived)) < value["n"] and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    return len(set(_arrived))


blocking = Pipeline("blocking", version=1)
_gate = threading.Event()
_started: list[str] = []


@blocking.step()
def wait_for_gate(value: dict[str, Any]) -> str:
    _started.append(value["id"])
    if value.get("block"):
        _gate.wait(WAIT_S)
    return value["id"]


watched = Pipeline("watched", version=1)


@watched.step(heartbeat_timeout_s=4.0, timeout_s=600)
def until_stopped(value: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    ctx.heartbeat({"n": 1})  # right after the start report: throttled
    ctx.heartbeat({"n": 2})  # replaces it
    deadline = time.monotonic() + WAIT_S
    while value["wait"] and not ctx.stop_requested and time.monotonic() < deadline:
        time.sleep(0.005)  # the poll interval of a deadline-bounded wait
    return {"stopped": ctx.stop_requested}


@watched.step()
def quick(value: dict[str, Any]) -> dict[str, Any]:
    return value


charged = Pipeline("charged", version=1)


@charged.step(effectful=True)
def charge_once(value: dict[str, Any]) -> str:
    _started.append(value["id"])
    return str(value["id"])


APP = Application([together, blocking, watched, charged])


# --- support -----------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_900_000_000_000

    def __call__(self) -> int:
        return self.now


@dataclass
class Space:
    transport: Transport
    topology: Topology
    group: str
    workers: list[tuple[Worker, threading.Event, threading.Thread]] = field(default_factory=list)

    def topic(self, name: TopicName) -> str:
        return self.topology.name(name)

    def produce(self, *messages: WorkItem | StopNotice | ClaimReply) -> None:
        """Work items to segments.work, stop notices and claims' answers to segments.control."""
        producer = self.transport.producer()
        try:
            for message in messages:
                key = message.run_id.encode()
                topic = TopicName.WORK if isinstance(message, WorkItem) else TopicName.CONTROL
                producer.produce(Outbound(self.topic(topic), key, encode(message)))
            producer.flush()
        finally:
            producer.close()

    def start_worker(self, **options: Any) -> Worker:
        worker = Worker(self.transport, APP, self.topology, group=self.group, **options)
        stop = threading.Event()
        thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
        thread.start()
        self.workers.append((worker, stop, thread))
        return worker

    def stop_worker(self, worker: Worker) -> None:
        for entry in self.workers:
            if entry[0] is worker:
                entry[1].set()
                entry[2].join(WAIT_S)
                assert not entry[2].is_alive()
                self.workers.remove(entry)
                return

    def results(self) -> list[SegmentResult | AttemptProgress]:
        reader = self.transport.reader()
        try:
            tp = TopicPartition(self.topic(TopicName.RESULTS), 0)
            end = reader.end_offset(tp)
            messages = [decode(r.value) for batch in reader.read(tp, 0, end) for r in batch]
        finally:
            reader.close()
        return [m for m in messages if isinstance(m, SegmentResult | AttemptProgress)]

    def wait_results(
        self, done: Callable[[list[SegmentResult | AttemptProgress]], bool]
    ) -> list[SegmentResult | AttemptProgress]:
        deadline = time.monotonic() + WAIT_S
        while True:
            found = self.results()
            if done(found):
                return found
            assert time.monotonic() < deadline, f"not there in {WAIT_S}s: {found}"
            time.sleep(0.02)  # the poll interval of a deadline-bounded wait


@pytest.fixture
def space(transport: Transport) -> Iterator[Space]:
    topology = Topology(prefix=f"wrt.{uuid.uuid4().hex[:10]}.", partitions=1)
    wanted = {TopicName.WORK, TopicName.CONTROL, TopicName.RESULTS, TopicName.REJECTED}
    specs = [
        TopicSpec(topology.name(d.name), 1, dict(d.config))
        for d in topology.declarations
        if d.name in wanted
    ]
    admin = transport.admin()
    try:
        admin.create_topics(specs)
        deadline = time.monotonic() + WAIT_S
        while not {s.name for s in specs} <= set(admin.describe_topics()):
            assert time.monotonic() < deadline, "topics never appeared"
            time.sleep(0.05)
    finally:
        admin.close()
    made = Space(transport, topology, f"workers-{uuid.uuid4().hex[:8]}")
    yield made
    _gate.set()
    for worker, _, _ in list(made.workers):
        made.stop_worker(worker)


def work(pipeline: str, value: Any, run_id: str | None = None) -> WorkItem:
    return WorkItem(
        run_id=run_id or f"run-{uuid.uuid4().hex[:8]}",
        pipeline=pipeline,
        pipeline_version=1,
        segment=0,
        attempt=1,
        generation=1,
        first_step=0,
        input=payload.dumps(value),
        expires_ms=0,  # long expired: a worker runs it anyway
    )


def outputs(found: list[SegmentResult | AttemptProgress]) -> dict[str, Any]:
    return {
        m.run_id: payload.loads(m.steps[-1].output)
        for m in found
        if isinstance(m, SegmentResult) and m.steps
    }


# --- tests -------------------------------------------------------------------------------


def test_async_steps_run_at_once_up_to_the_concurrency(space: Space) -> None:
    _arrived.clear()
    items = [work("together", {"id": str(i), "n": 4}) for i in range(4)]
    space.produce(*items)
    space.start_worker(concurrency=4)
    found = space.wait_results(lambda f: len(outputs(f)) == 4)
    assert set(outputs(found).values()) == {4}  # each saw the four together
    assert not [m for m in found if isinstance(m, AttemptProgress)]  # fast steps: no reports


def test_a_worker_takes_no_more_than_it_can_start(space: Space) -> None:
    _gate.clear()
    _started.clear()
    items = [work("blocking", {"id": str(i), "block": True}) for i in range(5)]
    space.produce(*items)
    worker = space.start_worker(concurrency=2)
    deadline = time.monotonic() + WAIT_S
    while len(_started) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)  # the poll interval of a deadline-bounded wait
    assert worker.taken == 2  # two running, nothing read ahead
    assert len(_started) == 2
    _gate.set()
    found = space.wait_results(lambda f: len(outputs(f)) == 5)
    assert sorted(outputs(found).values()) == [str(i) for i in range(5)]


def test_progress_reports_and_a_stop_notice_reach_a_running_step(space: Space) -> None:
    clock = Clock()
    began = clock.now
    fast = work("watched", {"wait": False})
    slow = work("watched", {"wait": True})
    space.produce(fast, slow)
    worker = space.start_worker(concurrency=1, clock=clock)  # the notice: while it is full

    def reports(found: list[SegmentResult | AttemptProgress]) -> list[AttemptProgress]:
        return [m for m in found if isinstance(m, AttemptProgress) and m.run_id == slow.run_id]

    space.wait_results(lambda f: len(reports(f)) == 1)
    clock.now += 1_000  # a quarter of the heartbeat timeout: the throttled heartbeat goes out
    space.wait_results(lambda f: len(reports(f)) == 2)
    notice = StopNotice(
        run_id=slow.run_id, segment=0, attempt=1, generation=1, reason="cancel", at_ms=clock.now
    )
    space.produce(notice)
    found = space.wait_results(lambda f: len(outputs(f)) == 2)
    assert [(m.report, m.step, m.at_ms, m.details) for m in reports(found)] == [
        ("started", 0, began, None),  # at once: the step has a heartbeat timeout
        ("heartbeat", 0, began + 1_000, b'{"n": 2}'),  # the latest details, when due
    ]
    first = reports(found)[0]
    assert (first.kind, first.segment, first.attempt, first.generation) == ("forward", 0, 1, 1)
    # The worker's id and this life of it: started again after a crash, it reports anew.
    assert first.worker_id == worker.reporter_id
    assert first.worker_id.startswith(f"{worker.worker_id}/")
    assert outputs(found) == {slow.run_id: {"stopped": True}, fast.run_id: {"stopped": False}}


def test_what_a_worker_had_not_finished_is_delivered_again(space: Space) -> None:
    """Offsets are committed only below the oldest unfinished record: a worker that goes
    away with a step still running leaves that item (and what follows) to the next."""
    _gate.clear()
    _started.clear()
    stuck = work("blocking", {"id": "stuck", "block": True})
    done = work("blocking", {"id": "done"})
    space.produce(stuck, done)
    first = space.start_worker(concurrency=2, drain_timeout_s=0.0)
    space.wait_results(lambda f: set(outputs(f).values()) == {"done"})
    space.stop_worker(first)  # "crashes": its step still runs, its result will never come
    assert "stuck" in _started
    _gate.set()
    _started.clear()
    space.start_worker(concurrency=2)
    found = space.wait_results(lambda f: "stuck" in outputs(f).values())
    assert "stuck" in _started  # run again by the second worker
    finished = [m for m in found if isinstance(m, SegmentResult)]
    assert {m.run_id for m in finished} == {stuck.run_id, done.run_id}


def test_an_attempt_stopped_or_lost_before_it_starts_is_not_run(space: Space) -> None:
    """A stop notice read before the item starts: a stopped run's attempt ends failed
    (its run waits for a result), a lost one's with nothing (another attempt runs)."""
    _gate.clear()
    _started.clear()
    busy = work("blocking", {"id": "busy", "block": True})
    stopped, lost, after = (work("blocking", {"id": name}) for name in ("stopped", "lost", "after"))
    space.produce(busy, stopped, lost, after)
    worker = space.start_worker(concurrency=1)  # the others wait behind ``busy``
    wait_for(lambda: "busy" in _started)
    space.produce(
        StopNotice(
            run_id=stopped.run_id, segment=0, attempt=1, generation=1, reason="cancelled", at_ms=1
        ),
        StopNotice(
            run_id=lost.run_id, segment=0, attempt=1, generation=1, reason="attempt_lost", at_ms=1
        ),
    )
    wait_for(lambda: all(worker.stops.notice_for(ref_of(i)) for i in (stopped, lost)))
    _gate.set()
    found = space.wait_results(lambda f: set(outputs(f).values()) == {"busy", "after"})
    assert _started == ["busy", "after"]
    ended = {m.run_id: m for m in found if isinstance(m, SegmentResult)}
    assert lost.run_id not in ended
    failed = ended[stopped.run_id]
    assert (failed.outcome, failed.error_type, failed.retryable) == ("failed", NOT_RUN, False)
    assert (failed.failed_step, failed.steps) == (0, ())


def test_an_effectful_attempt_runs_only_once_its_claim_is_granted(space: Space) -> None:
    _started.clear()
    granted, refused = work("charged", {"id": "granted"}), work("charged", {"id": "refused"})
    space.produce(granted, refused)
    worker = space.start_worker(concurrency=2, start_report_after_ms=0)  # a start: reported

    def claims(found: list[SegmentResult | AttemptProgress]) -> dict[str, AttemptProgress]:
        return {m.run_id: m for m in found if isinstance(m, AttemptProgress) and m.claim}

    claimed = claims(space.wait_results(lambda f: len(claims(f)) == 2))
    assert _started == []  # nothing runs before its claim is answered
    assert {(c.step, c.report, c.worker_id) for c in claimed.values()} == {
        (0, "started", worker.reporter_id)
    }

    def reply(item: WorkItem, worker_id: str, **answer: Any) -> ClaimReply:
        return ClaimReply(
            run_id=item.run_id,
            segment=0,
            attempt=1,
            generation=1,
            worker_id=worker_id,
            at_ms=1,
            **answer,
        )

    space.produce(
        reply(refused, "another-worker/1", granted=True),  # not this worker's claim
        reply(refused, worker.reporter_id, granted=False, reason="attempt_claimed"),
        reply(granted, worker.reporter_id, granted=True),
    )
    found = space.wait_results(lambda f: granted.run_id in outputs(f))
    assert _started == ["granted"]
    assert [m for m in found if isinstance(m, SegmentResult) and m.run_id == refused.run_id] == []
    started = [m for m in found if isinstance(m, AttemptProgress) and not m.claim]
    assert started == []  # the granted claim was its start report: none sent again


def wait_for(condition: Callable[[], object]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"not so within {WAIT_S}s"
        time.sleep(0.01)  # the poll interval of a deadline-bounded wait
