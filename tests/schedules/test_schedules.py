"""Schedules through the client: one processor host per module and transport, its
clock injected (``FakeClock``), so a fire time comes when the test moves it.

The Kafka run of this module (about 45 s, most of it the host's start) is marked
``slow``; ``tests/kafka/test_schedules_on_kafka.py`` is the cheap Kafka tier."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from processor.clients.client import Client
from processor.clients.schedules import ScheduleError
from processor.engine.host import Host
from processor.facts.codec import codec
from processor.facts.models import SubmitRun
from processor.facts.topics import TopicName
from processor.model.schedules import fire_run_id
from processor.transport.deployment import Deployment
from tests.apps.pipelines import app, expected_steps3_result
from tests.apps.support import FakeClock, read_topic, transport_settings, wait_until
from tests.kafka.support import KafkaSpace
from tests.kafka_broker import kafka_bootstrap, unavailable_reason

MINUTE = 60_000


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
    data = tmp_path_factory.mktemp("schedules")
    space = None
    if request.param == "embedded":
        settings = transport_settings("embedded", data)
    else:
        bootstrap = kafka_bootstrap()
        if bootstrap is None:
            pytest.skip(unavailable_reason())
        space = KafkaSpace.new(bootstrap, partitions=2)
        settings = space.settings(data / "data")
    deployment = Deployment.from_settings(settings)
    clock = FakeClock()
    host = Host(deployment, app, workers=1, clock=clock)
    host.start()
    client = Client(settings=settings)
    try:
        yield Env(host, clock, client)
    finally:
        client.close()
        host.stop()
        if space is not None:
            space.delete_topics()
    assert not host.errors, host.errors


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
