"""A transactional call that hangs in librdkafka is abandoned; a new session takes over.

librdkafka 2.16 can block in ``send_offsets_to_transaction`` (or
``commit_transaction``) forever, ignoring its timeout, when the group coordinator
goes away during the call (confluentinc/librdkafka#5456, #5511). A broker restart
triggers it by chance; here a real producer is wrapped so that one named call
blocks until the test releases it, which makes the hang certain. The broker is
real: fencing, offsets and visibility are Kafka's own.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException

from processor.config.settings import Settings
from processor.errors import SessionLostError
from processor.facts.models import RunSubmitted, RunSucceeded, SegmentAttemptStarted, WorkItem
from processor.restore.replay import replay
from processor.transport.base import Outbound, TopicPartition, TopicSpec
from processor.transport.kafka import KafkaTransport
from processor.transport.kafka_common import translate
from processor.transport.kafka_session import KafkaSession
from tests.apps.pipelines import app
from tests.apps.support import LoopHarness, wait_until
from tests.kafka.support import poll_records
from tests.kafka_broker import kafka_bootstrap, unavailable_reason

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

#: Short, so the watchdog fires soon: it waits this plus its margins (15 s).
TRANSACTION_TIMEOUT_MS = 2_000
#: How late the caller may get control back after the watchdog's deadline.
SLACK_S = 5.0


class HangingProducer:
    """A real transactional producer whose ``hang_in`` call blocks until ``released``.

    Like the librdkafka bug, the blocked call ignores its timeout. Once released it
    goes on into the real producer, as a call that finally returns would.
    """

    def __init__(self, real: Any, hang_in: str) -> None:
        self._real = real
        self._hang_in = hang_in
        self.armed = True
        self.entered = threading.Event()
        self.released = threading.Event()
        self.finished = threading.Event()
        self.error: BaseException | None = None
        self.closed_on: str | None = None  # the thread that closed (purged) the real producer

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._real, name)
        if name != self._hang_in or not self.armed:
            return method

        def hanging(*args: Any) -> Any:
            self.armed = False
            self.entered.set()
            self.released.wait()
            try:
                return method(*args)
            except BaseException as exc:
                self.error = exc
                raise
            finally:
                self.finished.set()

        return hanging

    def purge(self) -> None:  # the first call of closing it
        self.closed_on = threading.current_thread().name
        self._real.purge()


def hang(session: KafkaSession, call: str) -> HangingProducer:
    """Make ``call`` of the session's producer hang (the one place that reaches inside)."""
    producer = HangingProducer(session._producer, call)
    session._producer = producer  # type: ignore[assignment]
    return producer


@pytest.fixture
def bootstrap() -> str:
    found = kafka_bootstrap()
    if found is None:
        pytest.skip(unavailable_reason())
    return found


@pytest.fixture
def released() -> Iterator[list[HangingProducer]]:
    """Hung producers to release at teardown, whatever happened."""
    hung: list[HangingProducer] = []
    yield hung
    for producer in hung:
        producer.released.set()


def test_a_hung_commit_is_abandoned_and_the_next_session_fences_its_transaction(
    bootstrap: str, tmp_path: Path, released: list[HangingProducer]
) -> None:
    settings = Settings(broker=f"kafka://{bootstrap}", data_dir=tmp_path / "data")
    transport = KafkaTransport(
        settings, session_timeout_ms=6_000, transaction_timeout_ms=TRANSACTION_TIMEOUT_MS
    )
    tag = uuid.uuid4().hex[:12]
    source, sink, group = f"hung.{tag}.in", f"hung.{tag}.out", f"hung-{tag}"
    admin = transport.admin()
    try:
        admin.create_topics([TopicSpec(source, 1), TopicSpec(sink, 1)])
    finally:
        admin.close()
    producer = transport.producer()
    try:
        for index in range(5):
            producer.produce(Outbound(source, b"k", f"input {index}".encode(), (), 0))
        producer.flush()
    finally:
        producer.close()

    # The first session's commit hangs after its offsets joined the transaction.
    first = transport.session(group, "p1")
    stuck = hang(first, "commit_transaction")
    released.append(stuck)
    first.subscribe([source], lambda _: None, lambda _: None)
    consumed = poll_records(first, 5)
    first.begin()
    first.produce(Outbound(sink, b"k", b"from the hung session", (), 0))
    started = time.monotonic()
    with pytest.raises(SessionLostError, match="commit transaction hung"):
        first.commit({TopicPartition(source, 0): consumed[-1].offset + 1})
    deadline = TRANSACTION_TIMEOUT_MS / 1000 + 15
    assert deadline <= time.monotonic() - started < deadline + SLACK_S
    assert stuck.entered.is_set() and not stuck.finished.is_set()
    with pytest.raises(SessionLostError):
        first.poll(1, 0.1)
    with pytest.raises(SessionLostError):
        first.begin()
    started = time.monotonic()
    first.close()  # leaves the group; the producer is left to its stuck call
    assert time.monotonic() - started < SLACK_S
    assert stuck.closed_on is None and not stuck.finished.is_set()

    # The next session of the same instance fences it: it reads the input again.
    second = transport.session(group, "p1")
    try:
        second.subscribe([source], lambda _: None, lambda _: None)
        again = poll_records(second, 5)
        assert [record.offset for record in again[:5]] == [r.offset for r in consumed[:5]]
        second.begin()
        second.produce(Outbound(sink, b"k", b"from the next session", (), 0))
        second.commit({TopicPartition(source, 0): again[4].offset + 1})

        # The stuck call returns at last: its commit is refused, then it is closed.
        stuck.released.set()
        wait_until(stuck.finished.is_set, 60, "the stuck commit to return")
        assert isinstance(stuck.error, KafkaException), stuck.error
        assert "fenced" in str(translate("commit", stuck.error)).lower(), stuck.error
        wait_until(lambda: stuck.closed_on is not None, 30, "the stuck producer to close")
        assert stuck.closed_on != threading.current_thread().name
    finally:
        second.close()

    reader = transport.reader()
    try:
        written = [r.value for batch in reader.read(TopicPartition(sink, 0), 0) for r in batch]
    finally:
        reader.close()
    assert written == [b"from the next session"]


def test_the_loop_rebuilds_its_session_after_a_hung_commit_and_ends_the_run_once(
    bootstrap: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    released: list[HangingProducer],
) -> None:
    tag = uuid.uuid4().hex[:10]
    settings = Settings(
        broker=f"kafka://{bootstrap}",
        data_dir=tmp_path / "data",
        topic_prefix=f"h{tag}.",
        group=f"h{tag}",
        partitions=2,
        kafka_session_timeout_ms=6_000,
        kafka_transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
    )
    sessions: list[KafkaSession] = []
    new_session = KafkaTransport.session

    def session_hanging_first(self: KafkaTransport, group: str, instance_id: str) -> KafkaSession:
        session = new_session(self, group, instance_id)
        if not sessions:
            released.append(hang(session, "send_offsets_to_transaction"))
        sessions.append(session)
        return session

    monkeypatch.setattr(KafkaTransport, "session", session_hanging_first)
    h = LoopHarness.for_settings(settings, app)
    try:
        (stuck,) = released
        run_id = h.submit("steps3", {"n": 7})
        started = time.monotonic()
        with caplog.at_level(logging.ERROR):
            while not stuck.entered.is_set():  # the commit of the submit hangs
                assert time.monotonic() - started < 60, "the submit was never committed"
                h.loop.run_once()
        deadline = TRANSACTION_TIMEOUT_MS / 1000 + 15
        assert deadline <= time.monotonic() - started < deadline + SLACK_S + 10
        assert "send offsets to transaction did not return within" in caplog.text
        assert h.loop.owned_partitions == []  # it let go of its stores
        assert h.facts(run_id) == []  # nothing of the abandoned transaction is visible

        def dispatched() -> list[WorkItem]:
            h.loop.run_once()
            return h.new_work()

        def succeeded() -> bool:
            h.loop.run_once()
            return any(isinstance(f, RunSucceeded) for f in h.facts(run_id))

        # The next round rejoins with a new session and decides the submit again.
        items = wait_until(dispatched, 60, "the dispatch")
        assert len(sessions) == 2
        for item in items:
            h.complete(item)
        wait_until(succeeded, 60, "the run to succeed")
        stuck.released.set()
        wait_until(stuck.finished.is_set, 60, "the stuck call to return")
        assert isinstance(stuck.error, KafkaException)  # fenced: it never commits
        for _ in range(5):
            h.loop.run_once()
        h.new_work()

        facts = h.facts(run_id)
        assert [f.seq for f in facts] == list(range(1, len(facts) + 1))
        assert len({f.fact_key for f in facts}) == len(facts)
        for kind in (RunSubmitted, SegmentAttemptStarted, RunSucceeded):
            assert sum(isinstance(f, kind) for f in facts) == 1, [type(f).__name__ for f in facts]
        assert len(h.work_items) == 1  # the abandoned dispatch never reached workers
    finally:
        h.close()
    deployment = h.deployment
    report = replay(
        deployment.transport, deployment.topology, deployment.settings.state_dir, verify=True
    )
    assert report.verified is True, report.differences
