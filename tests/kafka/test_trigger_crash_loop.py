"""kill -9 a ``processor run`` with triggers again and again while records flow into a user topic.

A thread of this process produces ``RECORDS`` records at a steady pace to a user
topic of 3 partitions (keys are customer ids, unrelated to run ids; about one in
25 is malformed: not JSON, or JSON the pipeline's mapping cannot use). Meanwhile
the processor (its trigger stage, loop and workers) is killed at moments chosen
by a seeded RNG (after a random amount of the trigger's committed progress, or as
soon as it reports that it is running) and started again. Afterwards:

- every well-formed record started exactly one run, which succeeded exactly once
  (``assert_exactly_once``: no other run, no fact key twice, RunSucceeded once);
- runs.commands holds exactly one SubmitRun per such record: the offsets were
  committed with the submits, so no record was submitted twice;
- every malformed record is in admission.rejected exactly once, with its reason;
- ``processor replay --verify`` agrees with the live projections.

A second test runs two processors that share the trigger group: one leaves (its
user partitions move to the other) and comes back (they are split again), then
the other is killed; the same checks hold (but replay, which compares one
processor's stores).

5,000 records and 5 kills, as the issue asks: about 47 s on a 2-core machine,
most of it the kills (each costs up to a group session timeout, 6 s, before the
restarted members get their partitions back).
Committing the offsets outside the submit's transaction makes it fail (SubmitRuns
twice for one record), even though the derived run ids keep the runs single.
"""

from __future__ import annotations

import json
import random
import threading
from collections import Counter
from pathlib import Path

import pytest

from processor.facts.codec import codec
from processor.facts.models import Rejected, SubmitRun
from processor.facts.topics import TopicName
from processor.transport.base import Outbound, TopicSpec, Transport
from processor.transport.deployment import Deployment
from processor.worker.trigger import DECODE_FAILED, MAPPING_FAILED
from tests.apps.pipelines import expected_steps3_result
from tests.apps.support import TopicTail, read_topic, wait_until
from tests.apps.trigger_pipelines import ORDERS, UNIQUE, expected_order_runs
from tests.kafka.conftest import ProcessFactory
from tests.kafka.support import (
    FactsWatch,
    KafkaProcessorProcess,
    KafkaSpace,
    assert_exactly_once,
    assert_replay_verifies,
    owned_partitions,
    read_facts,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

SEED = 20_261_201
RECORDS = 5_000
KILLS = 5
RATE_PER_S = 200  # about 25 s of records: most kills happen while they flow
USER_PARTITIONS = 3
APP = "tests.apps.trigger_pipelines:app"


class Feed:
    """Produces the user records on a thread at a steady pace, like a user's application."""

    def __init__(self, space: KafkaSpace, transport: Transport) -> None:
        self.topic = space.prefix + ORDERS
        self.transport = transport
        self.malformed: dict[bytes, str] = {}  # value -> the reason it must be rejected with
        self.done = threading.Event()
        self.errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        self._thread.join(120)
        assert not self.errors, self.errors

    def value(self, index: int) -> bytes:
        if index % 50 == 7:
            value = f"{{broken {index}".encode()
            self.malformed[value] = DECODE_FAILED
        elif index % 50 == 31:
            value = json.dumps({"m": index}).encode()
            self.malformed[value] = MAPPING_FAILED
        else:
            value = json.dumps({"n": index}).encode()
        return value

    def _run(self) -> None:
        rng = random.Random(SEED + 1)
        producer = self.transport.producer()
        try:
            for index in range(RECORDS):
                key = f"customer-{rng.randrange(500)}".encode()
                producer.produce(Outbound(self.topic, key, self.value(index)))
                if index % 20 == 19:
                    producer.flush()
                    # The pace of a steady source (a rate limit, not a synchronization).
                    self.done.wait(20 / RATE_PER_S)
            producer.flush()
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            producer.close()
            self.done.set()


def create_user_topics(space: KafkaSpace, deployment: Deployment) -> None:
    admin = deployment.transport.admin()
    try:
        specs = [TopicSpec(space.prefix + n, USER_PARTITIONS) for n in (ORDERS, UNIQUE)]
        admin.create_topics(specs)
    finally:
        admin.close()


def trigger_process(
    processes: ProcessFactory, space: KafkaSpace, name: str
) -> KafkaProcessorProcess:
    process = processes(name)
    process.app = APP
    process.extra_env = {"TEST_TRIGGER_PREFIX": space.prefix}
    return process


def assert_one_run_per_record(
    space: KafkaSpace,
    deployment: Deployment,
    feed: Feed,
    running: list[KafkaProcessorProcess],
) -> None:
    """Once every record's run ended: one run, one submit per record; bad ones rejected once.

    Stops the ``running`` processes (each must exit cleanly), then checks the journal,
    runs.commands and admission.rejected, and ``replay --verify`` on the first one.
    """
    topology = deployment.topology
    reader = deployment.transport.reader()
    records = list(read_topic(reader, feed.topic, USER_PARTITIONS))
    assert len(records) == RECORDS
    expected = expected_order_runs(space.prefix, records)
    assert len(expected) == RECORDS - len(feed.malformed)
    watch = FactsWatch(reader, topology)

    def all_ended() -> bool:
        for process in running:
            process.check_alive()
        return watch.all_ended(expected)

    wait_until(all_ended, 120, "every triggered run to end", max_pause_s=0.2)
    for process in running:
        assert process.stop() == 0, process.log_text()[-3000:]

    facts = read_facts(reader, topology)
    assert_exactly_once(facts, expected, result=expected_steps3_result)
    submits = [
        codec().decode_as(r.value, SubmitRun)
        for r in read_topic(reader, topology.name(TopicName.COMMANDS), topology.partitions)
    ]
    assert Counter(s.run_id for s in submits) == Counter(dict.fromkeys(expected, 1))
    rejected = [
        codec().decode_as(r.value, Rejected)
        for r in read_topic(reader, topology.name(TopicName.REJECTED), topology.partitions)
    ]
    reasons = Counter(
        (r.original_value, r.reason) for r in rejected if r.source_topic == feed.topic
    )
    assert reasons == Counter(feed.malformed.items())
    reader.close()

    if len(running) == 1:  # a replay compares with one processor's stores: all partitions
        report = assert_replay_verifies(space, running[0].data_dir)
        assert report["runs"] == len(expected)


def test_kill_9_while_records_flow_starts_exactly_one_run_per_record(
    space: KafkaSpace, processes: ProcessFactory, tmp_path: Path
) -> None:
    deployment = space.deployment(tmp_path / "client")
    create_user_topics(space, deployment)
    processor = trigger_process(processes, space, "processor")
    topology = deployment.topology
    reader = deployment.transport.reader()
    commands = TopicTail(reader, topology.name(TopicName.COMMANDS), topology.partitions)
    rng = random.Random(SEED)
    feed = Feed(space, deployment.transport)

    def submitted_at_least(target: int) -> bool:
        processor.check_alive()
        return commands.end_total() >= target

    processor.start()
    feed.start()
    at_start = set(rng.sample(range(KILLS), 1))
    kills: list[tuple[str, bool]] = []  # (when, records still flowing)
    for round_ in range(KILLS):
        if round_ in at_start:
            processor.wait_running()  # while it joins its groups and restores
            when = "at start"
        else:
            target = commands.end_total() + rng.randint(20, 200)
            wait_until(lambda t=target: submitted_at_least(t), 90, f"{target} submits", 0.01)
            when = f"at {target} submits"
        assert processor.kill() == -9
        kills.append((when, not feed.done.is_set()))
        processor.start()
    feed.join()
    reader.close()
    assert sum(flowing for _, flowing in kills) >= 2, kills

    assert_one_run_per_record(space, deployment, feed, [processor])


def test_rebalances_between_two_processors_start_exactly_one_run_per_record(
    space: KafkaSpace, processes: ProcessFactory, tmp_path: Path
) -> None:
    """Two processors share the trigger group; one leaves and comes back, then one is killed."""
    deployment = space.deployment(tmp_path / "client")
    create_user_topics(space, deployment)
    first = trigger_process(processes, space, "first")
    second = trigger_process(processes, space, "second")
    topology = deployment.topology
    reader = deployment.transport.reader()
    commands = TopicTail(reader, topology.name(TopicName.COMMANDS), topology.partitions)
    feed = Feed(space, deployment.transport)

    def progressed(by: int) -> None:
        target = commands.end_total() + by
        wait_until(lambda: commands.end_total() >= target, 90, f"{target} submits", 0.01)

    def owns_user_partitions(process: KafkaProcessorProcess) -> set[int]:
        process.check_alive()
        return owned_partitions(process.log_text(), feed.topic)

    first.start()
    second.start()
    feed.start()
    wait_until(lambda: owns_user_partitions(second), 60, "the second to share the user topic")
    progressed(150)
    assert second.stop() == 0  # leaves both groups: its partitions move to the first
    wait_until(lambda: len(owns_user_partitions(first)) == USER_PARTITIONS, 60, "all to first")
    progressed(150)
    second.start()  # and back: the partitions are split again
    wait_until(lambda: owns_user_partitions(second), 60, "the second to share them again")
    progressed(150)
    flowing = not feed.done.is_set()
    assert first.kill() == -9  # its partitions move once its session times out
    first.start()
    feed.join()
    reader.close()
    assert flowing

    assert_one_run_per_record(space, deployment, feed, [first, second])
