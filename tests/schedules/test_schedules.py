"""Schedules through the client: one processor host per module and transport, its
clock injected (``FakeClock``), so a fire time comes when the test moves it.

The Kafka run of this module (about 45 s, most of it the host's start) is marked
``slow``; ``tests/kafka/test_schedules_on_kafka.py`` is the cheap Kafka tier."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from processor.clients.client import Client, status_dict
from processor.clients.schedules import ScheduleError
from processor.engine.host import Host
from processor.facts.codec import codec, encode
from processor.facts.models import Rejected, ScheduleCommand, ScheduledRunLinked, SubmitRun
from processor.facts.topics import TopicName
from processor.model.schedules import fire_run_id
from processor.transport.base import Outbound
from processor.transport.deployment import Deployment
from processor.worker.pipeline import Application
from tests.apps.pipelines import expected_steps3_result, steps3
from tests.apps.sleep_pipelines import alarm
from tests.apps.support import FakeClock, read_topic, wait_until
from tests.kafka.support import hosted

MINUTE = 60_000
DAY = 86_400_000
#: ``steps3`` ends at once; ``alarm`` sleeps until its input's ``wake_ms`` (a day on).
app = Application([steps3, alarm])


class Env:
    def __init__(self, host: Host, clock: FakeClock, client: Client) -> None:
        self.host, self.clock, self.client = host, clock, client

    def submits(self, schedule_id: str) -> list[str]:
        """Run ids submitted by the schedule (every SubmitRun on runs.commands)."""
        topology = self.host.deployment.topology
        reader = self.host.deployment.transport.reader()
        try:
            records = read_topic(reader, topology.name(TopicName.COMMANDS), topology.partitions)
            commands = [codec().decode(r.value) for r in records]
        finally:
            reader.close()
        return sorted(
            c.run_id
            for c in commands
            if isinstance(c, SubmitRun) and c.run_id.startswith(f"{schedule_id}@")
        )

    def advance(self, ms: int) -> None:
        self.clock.advance_to(self.clock.now_ms + ms)


@pytest.fixture(
    scope="module",
    params=["embedded", pytest.param("kafka", marks=[pytest.mark.kafka, pytest.mark.slow])],
)
def env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    clock = FakeClock()

    def host_of(deployment: Deployment) -> Host:
        return Host(deployment, app, workers=1, clock=clock)

    data = tmp_path_factory.mktemp("schedules")
    with hosted(request.param, data, host_of) as (host, client):
        yield Env(host, clock, client)


def _id() -> str:
    return f"s-{uuid.uuid4().hex[:8]}"


def test_an_interval_schedule_starts_one_run_per_fire_time(env: Env) -> None:
    sid, start = _id(), env.clock.now_ms
    receipt = env.client.schedules.create(
        sid, "steps3", {"n": 2}, interval_s=60, start_ms=start, timezone="Europe/Paris"
    )
    assert receipt.changed is True and receipt.refusal is None
    listed = env.client.schedules.get(sid)
    assert listed is not None and listed["next_fire_ms"] == start + MINUTE
    assert listed["last_fire_ms"] is None and listed["paused"] is False

    env.advance(MINUTE)
    run_id = fire_run_id(sid, start + MINUTE)
    wait_until(lambda: env.client.status(run_id), 30, "the first fire's run")
    result = env.client.wait(run_id, timeout_s=30)
    assert result.output == expected_steps3_result(2)
    # The run names its schedule and fire time: in its status and its history.
    shown = status_dict(env.client.status(run_id))
    assert shown["schedule"] == {"schedule_id": sid, "fire_ms": start + MINUTE}
    linked = [f for f in env.client.history(run_id) if isinstance(f, ScheduledRunLinked)]
    assert [(f.schedule_id, f.fire_ms) for f in linked] == [(sid, start + MINUTE)]
    env.advance(MINUTE)
    wait_until(lambda: len(env.submits(sid)) == 2, 30, "the second fire")
    assert env.submits(sid) == [fire_run_id(sid, start + k * MINUTE) for k in (1, 2)]
    listed = wait_until(lambda: env.client.schedules.get(sid), 10, "the schedule")
    assert listed["last_fire_ms"] == start + 2 * MINUTE
    assert listed["next_fire_ms"] == start + 3 * MINUTE
    env.client.schedules.delete(sid)


def test_pause_stops_firing_and_resume_goes_on_from_now(env: Env) -> None:
    sid, start = _id(), env.clock.now_ms
    env.client.schedules.create(sid, "steps3", {"n": 1}, interval_s=60, start_ms=start)
    assert env.client.schedules.pause(sid).changed is True
    assert env.client.schedules.pause(sid).changed is False  # already paused: a repeat
    listed = env.client.schedules.get(sid)
    assert listed is not None and listed["paused"] is True and listed["next_fire_ms"] is None
    env.advance(3 * MINUTE)
    resumed_at = env.clock.now_ms
    assert env.client.schedules.resume(sid).changed is True
    listed = env.client.schedules.get(sid)
    assert listed is not None and listed["next_fire_ms"] == start + 4 * MINUTE
    env.advance(MINUTE)
    wait_until(lambda: env.submits(sid), 30, "the fire after the resume")
    assert env.submits(sid) == [fire_run_id(sid, start + 4 * MINUTE)]
    assert resumed_at == start + 3 * MINUTE
    env.client.schedules.delete(sid)


def test_delete_removes_it_from_the_listing_and_stops_it(env: Env) -> None:
    sid, start = _id(), env.clock.now_ms
    env.client.schedules.create(sid, "steps3", 1, interval_s=60, start_ms=start)
    assert env.client.schedules.delete(sid).changed is True
    assert env.client.schedules.get(sid) is None
    assert sid not in [s["schedule_id"] for s in env.client.schedules.list()]
    again = env.client.schedules.pause(sid)
    assert again.refusal == "unknown_schedule"


def test_a_cron_schedule_fires_in_its_time_zone(env: Env) -> None:
    sid = _id()
    # Every day at 09:00 in Tokyo, which is 00:00 UTC
    env.client.schedules.create(sid, "steps3", {"n": 3}, cron="0 9 * * *", timezone="Asia/Tokyo")
    listed = env.client.schedules.get(sid)
    assert listed is not None
    day = 86_400_000
    assert listed["next_fire_ms"] % day == 0 and listed["next_fire_ms"] > env.clock.now_ms
    env.client.schedules.delete(sid)


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"cron": "0 99 * * *"}, "bad_cron"),
        ({"cron": "every day"}, "bad_cron"),
        ({"cron": "0 9 * * *", "timezone": "Mars/Olympus"}, "unknown_time_zone"),
        ({"interval_s": 0}, "bad_interval"),
        ({"cron": "0 9 * * *", "interval_s": 5}, "bad_schedule"),
        ({"interval_s": 5, "catch_up": "sometimes"}, "bad_policy"),
        ({"interval_s": 5, "overlap": "maybe"}, "bad_policy"),
    ],
)
def test_a_malformed_schedule_is_refused_before_it_is_sent(
    env: Env, kwargs: dict[str, object], reason: str
) -> None:
    with pytest.raises(ScheduleError) as refused:
        env.client.schedules.create(_id(), "steps3", 1, **kwargs)  # type: ignore[arg-type]
    assert refused.value.reason == reason


def test_an_unknown_pipeline_is_refused_by_the_processor(env: Env) -> None:
    sid = _id()
    receipt = env.client.schedules.create(sid, "no_such_pipeline", 1, interval_s=60)
    assert receipt.refusal == "unknown_pipeline" and receipt.changed is False
    assert env.client.schedules.get(sid) is None


def test_a_bad_schedule_id_is_refused(env: Env, tmp_path: Path) -> None:
    with pytest.raises(ScheduleError) as refused:
        env.client.schedules.create("has space", "steps3", 1, interval_s=60)
    assert refused.value.reason == "bad_schedule_id"


def _sleeper(env: Env, sid: str, overlap: str) -> int:
    """A schedule of ``alarm`` runs that sleep a day (they overlap); its start."""
    start = env.clock.now_ms
    wake = {"wake_ms": start + DAY}
    env.client.schedules.create(sid, "alarm", wake, interval_s=60, start_ms=start, overlap=overlap)
    return start


def _decided(env: Env, sid: str, what: str, count: int) -> dict[str, object]:
    def reached() -> dict[str, object] | None:
        found = env.client.schedules.get(sid)
        return found if found is not None and found[what] == count else None

    return wait_until(reached, 30, f"{what} of {sid} to reach {count}")


def _end(env: Env, run_id: str) -> None:
    wait_until(lambda: env.client.status(run_id), 30, f"run {run_id}")
    env.client.cancel(run_id, "test")
    wait_until(lambda: env.client.status(run_id).terminal, 30, f"run {run_id} to end")  # type: ignore[union-attr]


def test_overlap_skip_skips_a_fire_while_the_last_run_runs(env: Env) -> None:
    sid = _id()
    start = _sleeper(env, sid, "skip")
    env.advance(MINUTE)
    first = fire_run_id(sid, start + MINUTE)
    _decided(env, sid, "fired", 1)
    wait_until(lambda: env.client.status(first), 30, "the first run")
    env.advance(MINUTE)
    _decided(env, sid, "skipped", 1)
    assert env.submits(sid) == [first]
    _end(env, first)
    env.advance(MINUTE)
    _decided(env, sid, "fired", 2)
    assert env.submits(sid) == [first, fire_run_id(sid, start + 3 * MINUTE)]
    env.client.schedules.delete(sid)
    _end(env, fire_run_id(sid, start + 3 * MINUTE))


def test_overlap_queue_keeps_one_fire_until_the_last_run_ends(env: Env) -> None:
    sid = _id()
    start = _sleeper(env, sid, "queue")
    env.advance(MINUTE)
    first = fire_run_id(sid, start + MINUTE)
    _decided(env, sid, "fired", 1)
    wait_until(lambda: env.client.status(first), 30, "the first run")
    env.advance(MINUTE)
    assert _decided(env, sid, "queued_fire_ms", start + 2 * MINUTE)
    env.advance(MINUTE)
    _decided(env, sid, "skipped", 1)  # one queued at most
    assert env.submits(sid) == [first]
    _end(env, first)
    listed = _decided(env, sid, "fired", 2)
    assert listed["queued_fire_ms"] is None
    queued = fire_run_id(sid, start + 2 * MINUTE)
    assert env.submits(sid) == [first, queued]
    env.client.schedules.delete(sid)
    _end(env, queued)


def test_catch_up_all_fires_every_missed_time_in_order(env: Env) -> None:
    sid, start = _id(), env.clock.now_ms
    env.client.schedules.create(
        sid, "steps3", {"n": 1}, interval_s=60, start_ms=start, catch_up="all", catch_up_limit=3
    )
    env.advance(5 * MINUTE)  # a downtime of five fire times, as the stage sees it
    _decided(env, sid, "fired", 3)
    assert env.client.schedules.get(sid)["skipped"] == 2  # type: ignore[index]
    assert env.submits(sid) == [fire_run_id(sid, start + k * MINUTE) for k in (3, 4, 5)]
    env.client.schedules.delete(sid)


def _rejected_from_schedules(env: Env) -> list[Rejected]:
    topology = env.host.deployment.topology
    reader = env.host.deployment.transport.reader()
    try:
        records = read_topic(reader, topology.name(TopicName.REJECTED), topology.partitions)
        found = [codec().decode_as(r.value, Rejected) for r in records]
    finally:
        reader.close()
    return [r for r in found if r.source_topic == topology.name(TopicName.SCHEDULES)]


def test_garbage_and_unchecked_commands_on_the_topic_are_refused_and_kept(env: Env) -> None:
    """Another producer than the client: nothing is checked before the stage."""
    topology = env.host.deployment.topology
    topic = topology.name(TopicName.SCHEDULES)
    sid = _id()
    unchecked = ScheduleCommand(
        command_id="c-1", schedule_id=sid, action="create", requested_ms=env.clock.now_ms,
        pipeline="steps3", input=b"1", cron="0 0 31 2 *", timezone="Mars/Base",
    )  # fmt: skip
    other = ScheduleCommand(
        command_id="c-2", schedule_id=sid, action="explode", requested_ms=env.clock.now_ms
    )
    producer = env.host.deployment.transport.producer()
    try:
        for key, value in ((b"junk", b"\x00not a record"), (sid.encode(), encode(unchecked))):
            producer.produce(Outbound(topic, key, value))
        producer.produce(Outbound(topic, sid.encode(), encode(other)))
        producer.flush()
    finally:
        producer.close()

    def mine() -> list[Rejected]:
        found = _rejected_from_schedules(env)
        return [r for r in found if r.original_key in (b"junk", sid.encode())]

    rejections = wait_until(lambda: mine() if len(mine()) >= 3 else None, 30, "the rejections")
    assert sorted(r.reason for r in rejections) == [
        "undecodable",
        "unknown_schedule",
        "unknown_time_zone",
    ]
    assert all(r.original_value for r in rejections)
    # The stage goes on: a good schedule still fires
    good, start = _id(), env.clock.now_ms
    env.client.schedules.create(good, "steps3", {"n": 1}, interval_s=60, start_ms=start)
    env.advance(MINUTE)
    wait_until(lambda: env.submits(good), 30, "the good schedule to fire")
    env.client.schedules.delete(good)
