"""Schedules on a real broker: a ``processor run`` killed with SIGKILL while two
schedules fire every second gives exactly one run per fire time, and the downtime
is caught up as each schedule's policy says.

- ``every`` (catch-up ``all``): every fire time from the first to the last decided
  has exactly one ``fired`` fact and exactly one run, across the kills, none skipped.
- ``latest`` (catch-up ``last``): after a downtime of several fire times, the missed
  ones are recorded as skipped and only the latest fires; fired and skipped times
  together cover the grid, each once.

The cheap test fires for about 8 s with one kill (3 s down); the ``slow`` ones are the
issue's, 30 s with two kills, the second 10 s down, and a rebalance: two processors
share six schedules, one is killed (the other takes its schedules) and comes back.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from processor.clients.client import Client
from processor.facts.codec import codec
from processor.facts.models import RunSubmitted, ScheduleRecorded
from processor.facts.topics import TopicName
from processor.model.schedules import fire_run_id
from processor.transport.clock import wall_clock_ms
from processor.transport.deployment import Deployment
from tests.apps.support import read_topic, wait_until
from tests.kafka.conftest import ProcessFactory
from tests.kafka.support import KafkaProcessorProcess, KafkaSpace, read_facts

pytestmark = pytest.mark.kafka

SECOND = 1_000


def _recorded(deployment: Deployment, schedule_id: str) -> list[ScheduleRecorded]:
    topology = deployment.topology
    reader = deployment.transport.reader()
    try:
        records = read_topic(reader, topology.name(TopicName.SCHEDULES), topology.partitions)
        found = [codec().decode(r.value) for r in records]
    finally:
        reader.close()
    return [f for f in found if isinstance(f, ScheduleRecorded) and f.schedule_id == schedule_id]


def _fired(deployment: Deployment, schedule_id: str) -> list[int]:
    return [f.fire_ms or 0 for f in _recorded(deployment, schedule_id) if f.kind == "fired"]


def _scenario(
    space: KafkaSpace,
    processes: ProcessFactory,
    tmp_path: Path,
    downtimes_s: list[float],
    fires: int,
) -> None:
    processor = processes("processor", workers=0)
    deployment = space.deployment(tmp_path / "client")
    client = Client(deployment.transport, deployment.topology, deployment.settings.state_dir)
    processor.start()
    processor.wait_running(180)
    start = wall_clock_ms() // SECOND * SECOND
    for sid, catch_up in (("every", "all"), ("latest", "last")):
        receipt = client.schedules.create(
            sid, "steps3", {"n": 1}, interval_s=1, start_ms=start, catch_up=catch_up,
            catch_up_limit=1_000,
        )  # fmt: skip
        assert receipt.changed is True, receipt
    per_phase = fires // (len(downtimes_s) + 1)
    for phase, downtime_s in enumerate(downtimes_s, start=1):
        _fire_until(processor, deployment, phase * per_phase)
        processor.kill()
        _stay_down(wall_clock_ms() + round(downtime_s * SECOND))
        processor.start()
        processor.wait_running(180)
    _fire_until(processor, deployment, fires)
    for sid in ("every", "latest"):
        client.schedules.delete(sid)
    client.close()
    _check_every(deployment, start)
    _check_latest(deployment, start, downtimes_s)


def _stay_down(until_ms: int) -> None:
    """Wait until the wall clock reaches ``until_ms``: the fire times meanwhile are missed."""
    wait_until(lambda: wall_clock_ms() >= until_ms, 60, "the end of the downtime", 0.2)


def _fire_until(processor: KafkaProcessorProcess, deployment: Deployment, count: int) -> None:
    def fired() -> bool:
        processor.check_alive()
        return len(_fired(deployment, "every")) >= count

    wait_until(fired, count + 60, f"{count} fire times of 'every'", max_pause_s=0.5)


def _runs_of(deployment: Deployment, schedule_id: str) -> Counter[str]:
    reader = deployment.transport.reader()
    try:
        facts = read_facts(reader, deployment.topology)
    finally:
        reader.close()
    submitted = (f.run_id for f in facts if isinstance(f, RunSubmitted))
    return Counter(r for r in submitted if r.startswith(f"{schedule_id}@"))


def _check_every(deployment: Deployment, start: int) -> None:
    recorded = _recorded(deployment, "every")
    fired = Counter(f.fire_ms for f in recorded if f.kind == "fired")
    assert fired, "nothing fired"
    last = max(t or 0 for t in fired)
    grid = list(range(start + SECOND, last + 1, SECOND))
    assert sorted(t or 0 for t in fired) == grid, "a fire time missed or fired twice"
    assert [f for f in recorded if f.kind == "skipped"] == []
    _assert_one_run_each(deployment, "every", grid)


def _check_latest(deployment: Deployment, start: int, downtimes_s: list[float]) -> None:
    recorded = _recorded(deployment, "latest")
    fired = [f.fire_ms or 0 for f in recorded if f.kind == "fired"]
    assert len(fired) == len(set(fired)), "a fire time fired twice"
    missed = [f for f in recorded if f.kind == "skipped" and f.reason == "missed"]
    # Each downtime of d seconds leaves at least d - 1 fire times missed, in one catch-up
    big = [f.count or 0 for f in missed]
    for downtime_s in downtimes_s:
        assert any(count >= downtime_s - 1 for count in big), (downtime_s, big)
    skipped_total = sum(big)
    last = max(fired)
    assert len(fired) + skipped_total == (last - start) // SECOND, "the grid is not covered once"
    _assert_one_run_each(deployment, "latest", fired)


def _assert_one_run_each(deployment: Deployment, schedule_id: str, fire_times: list[int]) -> None:
    """Once the processor has taken every submit, each fire time has one run, no other."""
    expected = Counter({fire_run_id(schedule_id, t): 1 for t in fire_times})
    wait_until(lambda: _runs_of(deployment, schedule_id).keys() >= expected.keys(), 60, "the runs")
    assert _runs_of(deployment, schedule_id) == expected


def test_kill_9_while_schedules_fire_gives_one_run_per_fire_time(
    space: KafkaSpace, processes: ProcessFactory, tmp_path: Path
) -> None:
    _scenario(space, processes, tmp_path, downtimes_s=[3.0], fires=8)


@pytest.mark.slow
def test_thirty_seconds_of_fires_with_two_kills_and_ten_seconds_down(
    space: KafkaSpace, processes: ProcessFactory, tmp_path: Path
) -> None:
    _scenario(space, processes, tmp_path, downtimes_s=[2.0, 10.0], fires=30)


@pytest.mark.slow
def test_a_rebalance_moves_schedules_without_a_fire_time_twice_or_lost(
    space: KafkaSpace, processes: ProcessFactory, tmp_path: Path
) -> None:
    """Two processors share the schedules' partitions; one is killed (the other takes
    its schedules once its session expires) and started again (they are shared
    again): every schedule still has one fired fact and one run per fire time."""
    first, second = processes("first", workers=0), processes("second", workers=0)
    deployment = space.deployment(tmp_path / "client")
    client = Client(deployment.transport, deployment.topology, deployment.settings.state_dir)
    for process in (first, second):
        process.start()
    for process in (first, second):
        process.wait_running(180)
    start = wall_clock_ms() // SECOND * SECOND
    ids = [f"moved-{n}" for n in range(6)]  # spread over the 4 partitions
    for sid in ids:
        client.schedules.create(
            sid, "steps3", {"n": 1}, interval_s=1, start_ms=start, catch_up="all",
            catch_up_limit=1_000,
        )  # fmt: skip
    for count in (4, 12):
        _all_fired(first if count == 12 else second, deployment, ids, count)
        if count == 4:
            first.kill()
            _all_fired(second, deployment, ids, count + 4)
            first.start()
            first.wait_running(180)
    for sid in ids:
        client.schedules.delete(sid)
    client.close()
    for sid in ids:
        fired = sorted(f.fire_ms or 0 for f in _recorded(deployment, sid) if f.kind == "fired")
        assert fired == list(range(start + SECOND, fired[-1] + 1, SECOND)), sid
        _assert_one_run_each(deployment, sid, fired)


def _all_fired(
    alive: KafkaProcessorProcess, deployment: Deployment, ids: list[str], count: int
) -> None:
    def fired() -> bool:
        alive.check_alive()
        return all(len(_fired(deployment, sid)) >= count for sid in ids)

    wait_until(fired, count + 90, f"{count} fire times of each schedule", max_pause_s=0.5)
