"""An idle schedule stage does not wake at every commit of another process.

On the embedded log a poll that waits wakes whenever any connection commits (about
ten times a standard run); the schedule stage, which needs no millisecond latency,
polls once per pause instead (``ScheduleStage(idle_s=...)``).
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from processor.engine.host import Host
from processor.engine.schedules import schedule_group
from processor.facts.topics import TopicName
from processor.transport.base import Outbound
from processor.transport.deployment import Deployment
from processor.transport.embedded_session import EmbeddedSession
from tests.apps.support import transport_settings, wait_until
from tests.schedules.test_schedules import app

_COMMITS = 300


def test_an_idle_schedule_stage_polls_once_a_pause_whatever_others_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts: Counter[str] = Counter()
    fetch = EmbeddedSession._fetch

    def counted(session: EmbeddedSession, max_records: int) -> object:
        attempts[session._group] += 1
        return fetch(session, max_records)

    monkeypatch.setattr(EmbeddedSession, "_fetch", counted)
    settings = transport_settings("embedded", tmp_path)
    deployment = Deployment.from_settings(settings)
    stage_group = schedule_group(settings.group)
    host = Host(deployment, app, workers=1)
    host.start()
    producer = deployment.transport.producer()
    try:
        wait_until(lambda: attempts[stage_group] > 0, 30, "the schedule stage's first poll")
        topic = deployment.topology.name(TopicName.REJECTED)  # nobody in the host reads it
        before, started = attempts[stage_group], time.monotonic()
        for n in range(_COMMITS):
            producer.produce(Outbound(topic, b"k", f"{n}".encode()))
            producer.flush()  # a commit of its own connection
        elapsed = time.monotonic() - started
        polled = attempts[stage_group] - before
        # One poll a pause (0.1 s), whatever the commits: a stage woken by each of
        # them polls about once a commit.
        assert polled <= elapsed / 0.1 + 2, (polled, elapsed)
        assert not host.errors, host.errors
    finally:
        producer.close()
        host.stop()
