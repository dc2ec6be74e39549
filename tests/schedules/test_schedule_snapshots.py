"""The schedule stage restores from its snapshot, not from the start of runs.schedules.

runs.schedules keeps every fact of every schedule; a restarted host folds only what
came after its snapshot (``store/schedule_snapshots.py``), and a snapshot it cannot
trust sends it back to offset 0, with the same schedules either way.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.clients.client import Client
from processor.config.settings import Settings
from processor.engine.host import Host
from processor.facts.topics import TopicName
from processor.model.schedules import ScheduleSpec, ScheduleState
from processor.store import schedule_snapshots
from processor.transport.deployment import Deployment
from processor.transport.partitioner import partition_for
from tests.apps.support import FakeClock, transport_settings, wait_until
from tests.schedules.test_schedules import MINUTE, app

# --- the file ------------------------------------------------------------------------------

_maybe_ms = st.none() | st.integers(0, 2**53)
_states = st.builds(
    ScheduleState,
    schedule_id=st.text("abcxyz-_.0123", min_size=1, max_size=12),
    spec=st.builds(
        ScheduleSpec,
        pipeline=st.text(max_size=8),
        input=st.binary(max_size=16),
        timezone=st.sampled_from(["UTC", "Europe/Paris"]),
        start_ms=st.integers(0, 2**53),
        cron=st.none() | st.just("*/5 * * * *"),
        interval_ms=st.none() | st.integers(1, 10**9),
        jitter_ms=st.integers(0, 1000),
    ),
    created_ms=st.integers(0, 2**53),
    paused=st.booleans(),
    last_fire_ms=_maybe_ms,
    last_run_id=st.none() | st.text(max_size=10),
    queued_fire_ms=_maybe_ms,
    fired=st.integers(0, 10**6),
)


@given(st.lists(_states, max_size=4), st.integers(0, 2**40))
def test_a_snapshot_reads_back_as_it_was_written(
    tmp_path_factory: pytest.TempPathFactory, states: list[ScheduleState], offset: int
) -> None:
    path = tmp_path_factory.mktemp("snap") / "runs.schedules-0003.json"
    written = {state.schedule_id: state for state in states}
    schedule_snapshots.save(path, "runs.schedules", offset, written)
    found = schedule_snapshots.load(path, "runs.schedules")
    assert found == schedule_snapshots.Snapshot(offset, written)


@pytest.mark.parametrize(
    "text",
    ["", "{not json", "[]", '{"format": 1, "topic": "runs.schedules"}', '{"format": 99}'],
)
def test_a_snapshot_that_cannot_be_trusted_is_ignored(tmp_path: Path, text: str) -> None:
    path = tmp_path / "runs.schedules-0000.json"
    path.write_text(text)
    assert schedule_snapshots.load(path, "runs.schedules") is None


def test_a_snapshot_of_another_topic_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    schedule_snapshots.save(path, "a.runs.schedules", 7, {})
    assert schedule_snapshots.load(path, "b.runs.schedules") is None
    assert schedule_snapshots.load(path / "missing", "a.runs.schedules") is None


# --- a restarted host ---------------------------------------------------------------------


class Hosts:
    """Hosts started one after another on the same settings, one clock."""

    def __init__(self, settings: Settings) -> None:
        self.settings, self.clock = settings, FakeClock()
        self.host: Host | None = None

    def start(self) -> Host:
        self.host = Host(Deployment.from_settings(self.settings), app, workers=1, clock=self.clock)
        self.host.start()
        return self.host

    def stop(self) -> None:
        if self.host is not None:
            self.host.stop()
            assert not self.host.errors, self.host.errors
            self.host = None


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Hosts]:
    made = Hosts(transport_settings("embedded", tmp_path))
    try:
        yield made
    finally:
        made.stop()


def _fired(client: Client, sid: str, count: int) -> None:
    def reached() -> bool:
        found = client.schedules.get(sid)
        return found is not None and found["fired"] == count

    wait_until(reached, 30, f"{sid} fired {count} times")


def test_a_restarted_host_folds_only_what_came_after_its_snapshot(hosts: Hosts) -> None:
    sid = f"s-{uuid.uuid4().hex[:8]}"
    host = hosts.start()
    client = Client(settings=hosts.settings)
    try:
        client.schedules.create(sid, "steps3", {"n": 1}, interval_s=60, start_ms=hosts.clock.now_ms)
        for fired in (1, 2, 3):
            hosts.clock.advance_to(hosts.clock.now_ms + MINUTE)
            _fired(client, sid, fired)
        topology = host.deployment.topology
        topic = topology.name(TopicName.SCHEDULES)
        partition = partition_for(sid.encode(), topology.partitions)
        hosts.stop()  # its stage writes the snapshot of what it owns
        path = schedule_snapshots.snapshot_path(
            hosts.settings.state_dir / "schedules", topic, partition
        )
        snapshot = schedule_snapshots.load(path, topic)
        assert snapshot is not None and snapshot.offset > 0
        assert snapshot.schedules[sid].fired == 3

        restarted = hosts.start()
        stage = restarted.schedules
        assert stage is not None
        start, read = wait_until(lambda: stage.restored.get(partition), 30, "the restore")
        assert start == snapshot.offset and read == 0  # nothing came after it
        hosts.clock.advance_to(hosts.clock.now_ms + MINUTE)
        _fired(client, sid, 4)  # the next fire time, once

        hosts.stop()
        path.write_text("{broken")  # a snapshot it cannot trust: folded from the start
        again = hosts.start().schedules
        assert again is not None
        start, read = wait_until(lambda: again.restored.get(partition), 30, "the restore")
        assert start == 0 and read >= 5  # the create and four fires at least
        assert client.schedules.get(sid)["fired"] == 4  # type: ignore[index]
    finally:
        client.close()
