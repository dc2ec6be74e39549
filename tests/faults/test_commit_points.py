"""A processor that dies at each point of its commit path, then restarts.

The loop commits in three steps: (1) produce facts and messages in a log
transaction, (2) commit it with the consumed offsets, (3) apply the facts to
RocksDB. These tests stop the loop dead (an exception nothing catches, then the
loop is dropped without flushing anything) just before (2) and just before (3),
start a new loop on the same data dir, and check that the run ends exactly once,
with gapless facts and projections equal to a replay of the log.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from processor.clients.client import Client
from processor.facts.models import RunSubmitted, RunSucceeded, SegmentAttemptStarted
from processor.facts.topics import TopicName
from processor.restore.replay import replay
from processor.store.rocks import PartitionStore
from processor.store.staging import Staging
from processor.transport.base import TopicPartition
from processor.transport.embedded_session import EmbeddedSession
from processor.transport.partitioner import partition_for
from tests.apps.pipelines import app
from tests.apps.support import LoopHarness


class SimulatedCrash(BaseException):
    """The process dies here (a BaseException, so no handler in the loop swallows it)."""


class Tripwire:
    """Replaces a method; once armed, the next call raises SimulatedCrash instead."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, owner: type[Any], name: str) -> None:
        self.armed = False
        self.fired = 0
        original = getattr(owner, name)

        def guarded(instance: Any, *args: Any, **kwargs: Any) -> Any:
            if self.armed:
                self.armed = False
                self.fired += 1
                raise SimulatedCrash(f"{owner.__name__}.{name}")
            return original(instance, *args, **kwargs)

        monkeypatch.setattr(owner, name, guarded)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def loops(data_dir: Path) -> Iterator[list[LoopHarness]]:
    """Every harness a test starts; all closed at the end."""
    started: list[LoopHarness] = []
    try:
        yield started
    finally:
        for h in started:
            h.close()


def _start(loops: list[LoopHarness], data_dir: Path) -> LoopHarness:
    clock = loops[-1].clock if loops else None
    h = LoopHarness(data_dir, app, clock=clock)
    loops.append(h)
    return h


def _crash(h: LoopHarness) -> None:
    """Run one iteration that dies on the tripwire, then drop the loop unflushed."""
    with pytest.raises(SimulatedCrash):
        for _ in range(100):  # until the iteration with something to commit
            h.loop.run_once()
    h.loop.close()  # closes its stores and session; staged projection changes are lost


def _facts_offsets(h: LoopHarness, run_id: str) -> tuple[int, int]:
    """(the store's applied facts offset, the log end) of the run's partition."""
    topology = h.deployment.topology
    partition = partition_for(run_id.encode(), topology.partitions)
    end = h.reader.end_offset(TopicPartition(topology.name(TopicName.FACTS), partition))
    store = PartitionStore(h.deployment.settings.state_dir / f"p{partition:04d}", read_only=True)
    try:
        return store.facts_offset(), end
    finally:
        store.close()


def _finish_and_check(h: LoopHarness, run_id: str) -> None:
    items = h.drive(h.new_work, "work to do")
    for item in items:
        h.complete(item)
    h.drive(lambda: any(isinstance(f, RunSucceeded) for f in h.facts(run_id)), "success")
    facts = h.facts(run_id)
    assert [f.seq for f in facts] == list(range(1, len(facts) + 1))
    assert len({f.fact_key for f in facts}) == len(facts)
    assert sum(isinstance(f, RunSubmitted) for f in facts) == 1
    assert sum(isinstance(f, RunSucceeded) for f in facts) == 1
    assert sum(isinstance(f, SegmentAttemptStarted) for f in facts) == 1
    client = Client(h.deployment.transport, h.deployment.topology, h.deployment.settings.state_dir)
    state = client.stored_status(run_id)
    client.close()
    assert state is not None
    assert (state.status, state.version) == ("succeeded", len(facts))
    deployment = h.deployment
    report = replay(
        deployment.transport, deployment.topology, deployment.settings.state_dir, verify=True
    )
    assert report.verified is True, report.differences


def test_crash_after_the_log_commit_before_rocksdb(
    monkeypatch: pytest.MonkeyPatch, loops: list[LoopHarness], data_dir: Path
) -> None:
    tripwire = Tripwire(monkeypatch, Staging, "flush")
    first = _start(loops, data_dir)
    first.loop.run_once()  # joined and restored (nothing to restore yet)
    run_id = first.submit("steps3", {"n": 11})
    tripwire.armed = True
    _crash(first)
    assert tripwire.fired == 1

    # The facts are in the log, but the store never saw them.
    assert len(first.facts(run_id)) == 2  # RunSubmitted, SegmentAttemptStarted
    applied, end = _facts_offsets(first, run_id)
    assert applied < end

    second = _start(loops, data_dir)
    second.loop.run_once()  # restores: catches up from the store's offset
    applied, end = _facts_offsets(second, run_id)
    assert applied == end
    _finish_and_check(second, run_id)


def test_crash_before_the_log_commit(
    monkeypatch: pytest.MonkeyPatch, loops: list[LoopHarness], data_dir: Path
) -> None:
    tripwire = Tripwire(monkeypatch, EmbeddedSession, "commit")
    first = _start(loops, data_dir)
    first.loop.run_once()
    run_id = first.submit("steps3", {"n": 12})
    tripwire.armed = True
    _crash(first)
    assert tripwire.fired == 1
    assert first.facts(run_id) == []  # nothing of the transaction is visible

    # The new loop reads the submit again from the committed offsets.
    second = _start(loops, data_dir)
    _finish_and_check(second, run_id)
    assert len(second.work_items) == 1  # the aborted dispatch never reached workers


def test_crash_after_a_result_was_committed_before_rocksdb(
    monkeypatch: pytest.MonkeyPatch, loops: list[LoopHarness], data_dir: Path
) -> None:
    tripwire = Tripwire(monkeypatch, Staging, "flush")
    first = _start(loops, data_dir)
    run_id = first.submit("steps3", {"n": 13})
    (item,) = first.drive(first.new_work, "the attempt is dispatched")
    first.complete(item)
    tripwire.armed = True
    _crash(first)
    assert any(isinstance(f, RunSucceeded) for f in first.facts(run_id))

    # Restarted, the processor knows the run ended: nothing is dispatched again.
    second = _start(loops, data_dir)
    second.clock.advance_to(second.clock.now_ms + 600_000)  # past any attempt timeout
    for _ in range(3):
        second.loop.run_once()
    assert second.new_work() == [item]  # only the one dispatched before the crash
    facts = second.facts(run_id)
    assert [f.seq for f in facts] == list(range(1, len(facts) + 1))
    assert sum(isinstance(f, RunSucceeded) for f in facts) == 1
    deployment = second.deployment
    report = replay(
        deployment.transport, deployment.topology, deployment.settings.state_dir, verify=True
    )
    assert report.verified is True, report.differences
