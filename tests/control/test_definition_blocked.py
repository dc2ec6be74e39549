"""Version-blocked runs and a rolling deployment, on each transport.

The processor loop is driven by hand (a fake clock); the test plays the workers: it
produces their announcements (``worker.announce``) and runs their work items with
their own applications, so a worker without a run's version answers UnknownPipeline
exactly as a real one does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from processor.engine.fleet import Fleet
from processor.facts.models import (
    RetryScheduled,
    RunDefinitionBlocked,
    SegmentFailed,
    WorkItem,
)
from processor.facts.topics import TopicName
from processor.model.state import RunState
from processor.restore.replay import replay
from processor.store.listing import RunQuery, list_runs
from processor.store.rocks import PartitionStore
from processor.transport.base import Record, TopicPartition
from processor.worker.announce import Announcer
from processor.worker.executor import execute
from processor.worker.pipeline import Application
from tests.apps.support import FakeClock, LoopHarness, transport_settings
from tests.apps.version_pipelines import application

WARM_UP_MS = 5_001  # one announce interval (the default) and a little


class Worker:
    """A worker played by the test: its announcements, its application."""

    def __init__(self, name: str, *versions: int) -> None:
        self.name = name
        self.app: Application = application(*versions)

    def announce(self, h: LoopHarness, *, leaving: bool = False) -> None:
        announcer = Announcer(
            self.app, h.deployment.topology, worker_id=self.name, group="w", clock=h.clock
        )
        for record in announcer.records(leaving=leaving):
            h.producer.produce(record)
        h.producer.flush()
        expected = None if leaving else frozenset(self.app.versions)
        h.drive(lambda: h.loop.fleet.workers.get(self.name) == expected, f"{self.name} heard")

    def run(self, h: LoopHarness, item: WorkItem) -> None:
        result = execute(item, self.app, self.name)
        h.produce_model(TopicName.RESULTS, item.run_id, result)


class Deployment:
    """The processor, restarted with other versions loaded; the work it dispatched."""

    def __init__(self, transport: str, path: Path) -> None:
        self.settings = transport_settings(transport, path)
        self.clock = FakeClock()
        self.h: LoopHarness | None = None
        self.taken: set[tuple[str, int, int]] = set()

    def start(self, *versions: int) -> LoopHarness:
        if self.h is not None:
            self.h.close()
        self.h = LoopHarness(
            self.settings.data_dir, application(*versions), self.clock, settings=self.settings
        )
        # Liveness on the fake clock too, so the test moves past the warm-up at once.
        interval = self.settings.worker_announce_interval_ms
        self.h.loop.fleet = Fleet(interval, self.clock)
        return self.h

    def warm_up(self) -> None:
        self.clock.advance_to(self.clock() + WARM_UP_MS)

    def work(self, run_id: str) -> WorkItem:
        """Drive until a new work item of the run is dispatched; take it."""
        assert self.h is not None
        h = self.h

        def new() -> WorkItem | None:
            h.new_work()
            for item in h.work_items:
                identity = (item.run_id, item.segment, item.generation)
                if item.run_id == run_id and identity not in self.taken:
                    self.taken.add(identity)
                    return item
            return None

        return h.drive(new, f"a work item of {run_id}")

    def no_work(self, run_id: str) -> bool:
        assert self.h is not None
        self.h.new_work()
        return all(
            (i.run_id, i.segment, i.generation) in self.taken
            for i in self.h.work_items
            if i.run_id == run_id
        )

    def state(self, run_id: str) -> RunState:
        assert self.h is not None
        state = self.h.loop_state(run_id)
        assert state is not None
        return state

    def until(self, run_id: str, what: Callable[[RunState], bool], text: str) -> RunState:
        assert self.h is not None
        return self.h.drive(lambda: (s := self.h.loop_state(run_id)) and what(s) and s, text)  # type: ignore[union-attr]

    def close(self) -> None:
        if self.h is not None:
            self.h.close()
            self.h = None


@pytest.fixture
def deployment(transport: str, tmp_path: Path) -> Iterator[Deployment]:
    d = Deployment(transport, tmp_path)
    try:
        yield d
    finally:
        d.close()


def _result(state: RunState) -> object:
    assert state.status == "succeeded", state
    assert state.result is not None
    return json.loads(state.result)


def test_old_runs_finish_on_v1_new_ones_use_v2_a_blocked_run_waits_for_v3(
    deployment: Deployment,
) -> None:
    d = deployment
    # v1 deployed: a run starts on it and is in flight when v2 is rolled out.
    h = d.start(1)
    old_worker = Worker("old", 1)
    old_worker.announce(h)
    d.warm_up()
    old = h.submit("greet", {"who": "old"})
    in_flight = d.work(old)
    assert in_flight.pipeline_version == 1

    # v2 deployed: the processor loads both, a new worker both, the old one leaves.
    h = d.start(1, 2)
    new_worker = Worker("new", 1, 2)
    new_worker.announce(h)
    old_worker.announce(h, leaving=True)
    d.warm_up()
    new = h.submit("greet", {"who": "new"})
    item = d.work(new)
    assert item.pipeline_version == 2
    new_worker.run(h, item)
    assert _result(d.until(new, lambda s: s.terminal, "new run done")) == {"who": "new", "ran": 2}
    new_worker.run(h, in_flight)  # the old run goes on, pinned to v1
    assert _result(d.until(old, lambda s: s.terminal, "old run done")) == {"who": "old", "ran": 1}

    # v3 deployed to the processor, not yet to any worker. While the processor warms
    # up it knows no workers: a run is dispatched, and the worker answers UnknownPipeline.
    h = d.start(1, 2, 3)
    early = h.submit("greet", {"who": "early"})
    new_worker.run(h, d.work(early))
    blocked_early = d.until(early, lambda s: s.phase == "definition_blocked", "early blocked")
    assert blocked_early.attempt.step_attempts == 0  # not charged
    new_worker.announce(h)
    d.warm_up()
    late = h.submit("greet", {"who": "late"})  # now known: no live worker loads v3
    assert d.until(late, lambda s: s.phase == "definition_blocked", "late blocked")
    for _ in range(5):  # a few more rounds: still nothing dispatched
        h.loop.run_once()
    assert d.no_work(late)
    blocked = h.facts(late) + h.facts(early)
    assert sorted(f.reason for f in blocked if isinstance(f, RunDefinitionBlocked)) == [
        "no_live_worker",
        "worker_lacks_version",
    ]
    assert not [f for f in blocked if isinstance(f, SegmentFailed | RetryScheduled)]
    listed = _listing(d, "running")
    assert {listed[early], listed[late]} == {"definition_blocked"}
    assert _blocked_gauge(h) == {("greet", "3"): 2.0}

    # A worker with v3 starts (the other leaves): both blocked runs go on.
    v3_worker = Worker("v3", 1, 2, 3)
    new_worker.announce(h, leaving=True)
    v3_worker.announce(h)
    for run_id, who in ((early, "early"), (late, "late")):
        item = d.work(run_id)
        assert (item.pipeline_version, item.attempt) == (3, 1)
        v3_worker.run(h, item)
        state = d.until(run_id, lambda s: s.terminal, f"{who} done")
        assert _result(state) == {"who": who, "ran": 3}
    assert _blocked_gauge(h) == {}


def _listing(d: Deployment, status: str) -> dict[str, str]:
    """Run id -> phase, as the runs listing shows them."""
    state_dir = d.settings.state_dir
    stores = [PartitionStore(p, read_only=True) for p in sorted(state_dir.glob("p*"))]
    try:
        page = list_runs(stores, RunQuery(status=status), None, 100)
        return {run.run_id: run.phase for run in page.runs}
    finally:
        for store in stores:
            store.close()


def test_a_real_worker_announces_itself_runs_a_blocked_run_and_leaves(
    deployment: Deployment,
) -> None:
    import threading

    from processor.worker.service import Worker as RealWorker

    d = deployment
    h = d.start(1, 2)
    Worker("v1-only", 1).announce(h)
    d.warm_up()
    run_id = h.submit("greet", {"who": "real"})
    d.until(run_id, lambda s: s.phase == "definition_blocked", "blocked")
    worker = RealWorker(
        h.deployment.transport,
        application(1, 2),
        h.deployment.topology,
        group=h.deployment.settings.worker_group,
        worker_id="real-worker",
    )
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    thread.start()
    try:
        loads = frozenset({("greet", 1), ("greet", 2)})
        h.drive(lambda: h.loop.fleet.workers.get("real-worker") == loads, "the worker heard")
        state = d.until(run_id, lambda s: s.terminal, "the run done by the real worker")
        assert _result(state) == {"who": "real", "ran": 2}
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive()
    h.drive(lambda: "real-worker" not in h.loop.fleet.workers, "the worker left")


def _blocked_gauge(h: LoopHarness) -> dict[tuple[str, ...], float]:
    """``processor_runs_definition_blocked`` as a scrape reads it from the loop's census,
    checked against a recount of the stores."""
    from processor.store.census import RunCensus
    from processor.store.readers import open_readers
    from processor.web.collector import CensusCollector

    families = {f.name: f for f in CensusCollector(lambda: h.loop).collect()}
    samples = families["processor_runs_definition_blocked"].samples
    gauge = {(s.labels["pipeline"], s.labels["version"]): s.value for s in samples}
    stores = open_readers(h.deployment.settings.state_dir)
    try:
        recounted: dict[tuple[str, ...], float] = {}
        for store in stores:
            for (pipeline, version), n in RunCensus.count_from(store).blocked().items():
                key = (pipeline, str(version))
                recounted[key] = recounted.get(key, 0) + n
    finally:
        for store in stores:
            store.close()
    assert recounted == gauge
    return gauge


def test_a_wake_up_decision_that_raises_quarantines_its_run_the_others_go_on(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 30 item 5: a bug in the fleet wake-up of one blocked run quarantines it
    (source ``wake``); the other blocked run is dispatched; a release wakes it."""
    from processor.clients.client import Client
    from processor.engine import loop as loop_module
    from processor.facts.models import RunQuarantined
    from processor.model.decide import decide_unblock

    d = deployment
    h = d.start(1, 2, 3)
    Worker("old", 1, 2).announce(h)
    d.warm_up()
    victim, other = h.submit("greet", {"who": "victim"}), h.submit("greet", {"who": "other"})
    for run_id in (victim, other):
        d.until(run_id, lambda s: s.phase == "definition_blocked", f"{run_id} blocked")

    def broken(state: RunState | None, ctx: object) -> object:
        if state is not None and state.run_id == victim:
            raise RuntimeError("wake bug")
        return decide_unblock(state, ctx)  # type: ignore[arg-type]

    monkeypatch.setattr(loop_module, "decide_unblock", broken)
    v3_worker = Worker("v3", 1, 2, 3)
    v3_worker.announce(h)
    v3_worker.run(h, d.work(other))
    assert _result(d.until(other, lambda s: s.terminal, "other done")) == {"who": "other", "ran": 3}
    held = d.until(victim, lambda s: s.quarantine is not None, "victim quarantined")
    assert held.quarantine is not None and held.quarantine.source == "wake"
    assert [f.error for f in h.facts(victim) if isinstance(f, RunQuarantined)] == ["wake bug"]
    assert d.no_work(victim) and held.phase == "definition_blocked"

    monkeypatch.undo()
    deployment_ = h.deployment
    client = Client(deployment_.transport, deployment_.topology, deployment_.settings.state_dir)
    try:
        client.release(victim, wait_s=0)  # the reply is not awaited: the loop is ours to drive
    finally:
        client.close()
    v3_worker.run(h, d.work(victim))  # released: woken and dispatched
    assert _result(d.until(victim, lambda s: s.terminal, "victim done")) == {
        "who": "victim",
        "ran": 3,
    }


def test_runs_woken_in_a_round_that_rebalances_are_decided_on_the_new_stores(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that loads a blocked run's version comes in the round whose poll also
    rebalances the group: the poll revokes every partition and assigns them back, as an
    eager rebalance does (the chaos soak met it when a restarted processor rejoined).
    The woken run is decided on the stores of the new assignment, so the store holds
    every committed fact and replay --verify agrees; decided on the revoked stores, the
    dispatch was committed but not in the store, and the run went on twice."""
    d = deployment
    h = d.start(1, 2)
    Worker("old", 1).announce(h)
    d.warm_up()
    run_id = h.submit("greet", {"who": "woken"})
    d.until(run_id, lambda s: s.phase == "definition_blocked", "blocked")
    worker = Worker("new", 1, 2)
    worker.announce(h)  # heard: the next round wakes the blocked run

    session = h.loop._session
    assert session is not None
    facts_topic = h.deployment.topology.name(TopicName.FACTS)
    every = [TopicPartition(facts_topic, p) for p in range(h.deployment.topology.partitions)]
    poll = session.poll

    def rebalancing_poll(max_records: int, timeout_s: float) -> list[Record]:
        monkeypatch.setattr(session, "poll", poll)  # once
        h.loop._on_revoke(every)
        h.loop._on_assign(every)
        return poll(max_records, timeout_s)

    monkeypatch.setattr(session, "poll", rebalancing_poll)
    h.loop.run_once()
    assert session.poll == poll, "the round did not poll"
    item = d.work(run_id)
    assert item.pipeline_version == 2
    assert d.state(run_id).phase != "definition_blocked"  # the store has the dispatch
    worker.run(h, item)
    assert _result(d.until(run_id, lambda s: s.terminal, "done")) == {"who": "woken", "ran": 2}
    assert d.no_work(run_id)
    facts = h.facts(run_id)
    assert [f.seq for f in facts] == list(range(1, len(facts) + 1)), h.fact_types(run_id)
    assert len({f.fact_key for f in facts}) == len(facts), h.fact_types(run_id)
    log = h.deployment
    d.close()
    report = replay(log.transport, log.topology, log.settings.state_dir, verify=True)
    assert report.verified is True, report.differences
