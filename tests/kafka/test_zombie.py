"""A paused processor (SIGSTOP) loses its partitions; when it wakes up it is fenced.

SIGSTOP freezes the whole process, librdkafka's heartbeat threads included, so
the group evicts it after the session timeout and the other instance takes its
partitions over and carries on with its runs. On SIGCONT the zombie still holds
its old projections, in-flight batch and expired timers: whatever it tries to
commit must be refused. It logs the fence, drops its stores and rejoins. The
journal shows no fact key twice and every run succeeded exactly once.
"""

from __future__ import annotations

import dataclasses
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from processor.clients.client import Client
from processor.facts.topics import TopicName
from processor.transport.base import Outbound, Record, TopicPartition, TopicSpec, Transport
from processor.transport.kafka_session import KafkaSession
from processor.transport.partitioner import partition_for
from tests.apps.support import REPO_ROOT, wait_until
from tests.kafka.conftest import ProcessFactory
from tests.kafka.support import (
    FactsWatch,
    KafkaSpace,
    assert_replay_verifies,
    assert_steps3_once,
    submit_steps3,
)
from tests.kafka.zombie_session import ZOMBIE_VALUE

pytestmark = pytest.mark.kafka

RUNS = 1_200
#: What the zombie's processor loop (or its host) logs when the log refuses its commit:
#: fenced by the group generation, or (when the paused transaction outlived
#: transaction.timeout.ms) refused because the broker already aborted it. Its worker
#: threads log their own fence, which is not the point here.
#: A zombie paused between transactions has nothing to commit: it learns on waking
#: that its partitions were lost (the session logs "lost"), and never commits.
FENCE_LOG = re.compile(
    r"WARNING processor\.(loop|host): .*(fenced|commit failed)"
    r"|INFO processor\.transport\.kafka_session: .*: lost "
)


def test_paused_instance_is_fenced_after_another_took_its_partitions(
    space: KafkaSpace, processes: ProcessFactory, tmp_path: Path
) -> None:
    zombie, survivor = processes("zombie"), processes("survivor")
    everything = set(range(space.partitions))
    deployment = space.deployment(tmp_path / "client")
    topology = deployment.topology
    client = Client(deployment.transport, topology, deployment.settings.state_dir)
    reader = deployment.transport.reader()
    watch = FactsWatch(reader, topology)
    inputs: dict[str, int] = {}

    def submit(count: int, partitions: set[int] = everything) -> list[str]:
        return submit_steps3(client, inputs, count, lambda run_id: partition(run_id) in partitions)

    def committed_on(partitions: set[int]) -> int:
        facts = topology.name(TopicName.FACTS)
        return sum(reader.end_offset(TopicPartition(facts, p)) for p in partitions)

    def partition(run_id: str) -> int:
        return partition_for(run_id.encode(), topology.partitions)

    def split() -> bool:
        zombie.check_alive()
        survivor.check_alive()
        mine, theirs = zombie.owned(), survivor.owned()
        return bool(mine and theirs) and not mine & theirs and mine | theirs == everything

    try:
        zombie.start()
        wait_until(lambda: zombie.owned() == everything, 60, "the first instance to own all")
        survivor.start()
        wait_until(split, 60, "the two instances to share the partitions")
        zombie_owns = zombie.owned()

        # Freeze the zombie mid-workload: in the middle of a burst of submits to its
        # partitions, so it is deciding or committing a batch, not waiting for input.
        workload = submit(RUNS // 4)
        before = committed_on(zombie_owns)
        workload += submit(RUNS, zombie_owns)
        wait_until(
            lambda: committed_on(zombie_owns) >= before + 300, 60, "the burst", max_pause_s=0.005
        )
        zombie.pause()
        paused_at = time.monotonic()
        ended = set(watch.refresh())
        stranded = [r for r in workload if r not in ended and partition(r) in zombie_owns]
        assert stranded, "no run of the zombie's partitions was in flight"

        # The survivor takes the zombie's partitions and finishes its stranded runs.
        wait_until(lambda: survivor.owned() == everything, 60, "the survivor to own all")
        assert time.monotonic() - paused_at < 30
        wait_until(lambda: watch.all_ended(stranded), 60, "the survivor to finish them")
        assert zombie.owned() == zombie_owns  # frozen: it has not noticed anything

        # Wake the zombie: its commit is refused, it says so, and it rejoins the group.
        zombie.resume()
        wait_until(lambda: FENCE_LOG.search(zombie.log_text()), 30, "the zombie to log the fence")
        wait_until(split, 60, "the woken instance to rejoin and share again")

        wait_until(lambda: watch.all_ended(inputs), 120, "every run to end", max_pause_s=0.2)
        zombie_log, survivor_log = zombie.log_text(), survivor.log_text()
        assert zombie.stop() == 0, zombie_log[-3000:]
        assert survivor.stop() == 0, survivor_log[-3000:]
    finally:
        client.close()

    assert_steps3_once(reader, topology, inputs)
    assert_replay_verifies(space, zombie.data_dir)
    assert_replay_verifies(space, survivor.data_dir)


@pytest.mark.parametrize("commits", ["inputs", "timers", "fresh"])
def test_frozen_transaction_cannot_commit_after_a_takeover(
    space: KafkaSpace, tmp_path: Path, commits: str
) -> None:
    """Deterministically a commit attempt: the zombie is frozen holding consumed input.

    A processor frozen between transactions finds out on waking that its partitions
    were lost, and never tries to commit (the test above accepts that); this one
    freezes a session with an open transaction and consumed offsets, lets another
    member take the input over, wakes it and makes it commit. A commit of timer
    facts consumes nothing, but must be refused all the same: the session sends
    the committed positions it knows, so the group coordinator checks its generation.
    "fresh": timer facts committed right after the assignment, before any input was
    polled (the group consumed all of it before): the committed positions come from
    the lookup on assignment.
    """
    # Longer than the freeze: the group generation refuses the commit, not a broker
    # that already aborted the transaction.
    space = dataclasses.replace(space, transaction_timeout_ms=60_000)
    transport = space.deployment(tmp_path / "client").transport
    input_topic, output_topic = f"{space.prefix}zombie.in", f"{space.prefix}zombie.out"
    admin = transport.admin()
    try:
        admin.create_topics([TopicSpec(input_topic, 1, {}), TopicSpec(output_topic, 1, {})])
    finally:
        admin.close()
    producer = transport.producer()
    try:
        for index in range(10):
            producer.produce(Outbound(input_topic, b"key", f"input {index}".encode(), (), 0))
        producer.flush()
    finally:
        producer.close()

    group = f"{space.tag}-zombie-session"
    if commits == "fresh":
        _consume_all(transport, group, input_topic, 10)
    child = subprocess.Popen(
        [
            *(sys.executable, "-m", "tests.kafka.zombie_session"),
            *(group, input_topic, output_topic, commits),
        ],
        cwd=REPO_ROOT,
        env=space.env(tmp_path / "zombie"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    survivor = transport.session(group, "survivor")
    owned: set[int] = set()
    taken_over: list[Record] = []

    def takes_over(count: int) -> bool:
        taken_over.extend(survivor.poll(100, 0.1))
        return bool(owned) and len(taken_over) >= count

    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "READY"
        child.send_signal(signal.SIGSTOP)
        survivor.subscribe(
            [input_topic],
            lambda tps: owned.update(tp.partition for tp in tps),
            lambda tps: owned.difference_update(tp.partition for tp in tps),
        )
        expected = 0 if commits == "fresh" else 10
        wait_until(lambda: takes_over(expected), 60, "the survivor to take the input over")
        child.send_signal(signal.SIGCONT)
        out, _ = child.communicate("commit\n", timeout=60)
        assert child.returncode == 0
        assert out.startswith("FENCED"), out
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGCONT)
            child.kill()
            child.wait()
        survivor.close()

    # The survivor read the input from the group's committed position: the zombie's
    # offsets never committed, and nothing the zombie produced is visible.
    assert [r.offset for r in taken_over[:10]] == list(range(10 - expected, 10))
    reader = transport.reader()
    try:
        batches = reader.read(TopicPartition(output_topic, 0), 0)
        written = [record.value for batch in batches for record in batch]
    finally:
        reader.close()
    assert ZOMBIE_VALUE not in written


def _consume_all(transport: Transport, group: str, topic: str, count: int) -> None:
    """A member of ``group`` consumes ``count`` records of ``topic``, commits and leaves."""
    session = transport.session(group, "first")
    consumed: list[Record] = []
    try:
        session.subscribe([topic], lambda _: None, lambda _: None)
        wait_until(
            lambda: consumed.extend(session.poll(100, 0.1)) or len(consumed) >= count,
            60,
            "the first member to consume the input",
        )
        session.begin()
        session.commit({consumed[-1].position: consumed[-1].offset + 1})
    finally:
        session.close()


def test_a_commit_right_after_assignment_carries_the_committed_positions(
    space: KafkaSpace, tmp_path: Path
) -> None:
    """The generation fence of a timers-only commit needs offsets even before any poll.

    (The frozen "fresh" case above is refused by the membership check as well; this
    pins the offsets themselves.)
    """
    transport = space.deployment(tmp_path / "client").transport
    topic = f"{space.prefix}assigned.in"
    admin = transport.admin()
    try:
        admin.create_topics([TopicSpec(topic, 1, {})])
    finally:
        admin.close()
    producer = transport.producer()
    try:
        for index in range(5):
            producer.produce(Outbound(topic, b"key", b"%d" % index, (), 0))
        producer.flush()
    finally:
        producer.close()
    group = f"{space.tag}-assigned"
    _consume_all(transport, group, topic, 5)

    session = transport.session(group, "second")
    owned: list[TopicPartition] = []
    try:
        session.subscribe([topic], owned.extend, lambda _: None)
        wait_until(lambda: not session.poll(100, 0.1) and owned, 60, "the assignment")
        assert isinstance(session, KafkaSession)
        assert session._fencing_offsets({}) == {TopicPartition(topic, 0): 5}
    finally:
        session.close()
