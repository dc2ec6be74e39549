"""The embedded log with real concurrent processes, and a process killed mid-transaction.

Children are separate interpreters (``python -c``) working on the same log
directory; the parent waits on conditions in the log, never on fixed sleeps.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

from processor.transport.base import Outbound, Record, TopicPartition, TopicSpec
from processor.transport.embedded import EmbeddedTransport

pytestmark = pytest.mark.timeout(300)

REPO_ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 4

# Appends ``count`` records with a plain producer, flushing every ``every`` records.
APPENDER = """
import sys
from processor.transport.base import Outbound
from processor.transport.embedded import EmbeddedTransport

path, topic, count, every = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
producer = EmbeddedTransport(path).producer()
for i in range(count):
    producer.produce(Outbound(topic, b"child-%d" % (i % 17), b"child:%d" % i))
    if (i + 1) % every == 0:
        producer.flush()
producer.close()
"""

# Commits transactional batches forever; every record names its batch and the batch
# size. Before each batch it appends "begin <n>" to a progress file (unbuffered), so
# after a SIGKILL the parent knows the last batch that may have been in flight.
BATCH_COMMITTER = """
import os, random, sys
from processor.transport.base import Outbound
from processor.transport.embedded import EmbeddedTransport

path, source, sink, tag, progress = sys.argv[1:6]
session = EmbeddedTransport(path).session("killed-group", tag)
session.subscribe([source], lambda _: None, lambda _: None)
session.poll(1, 0.0)
progress_fd = os.open(progress, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
rng = random.Random()
value = bytes(1500)
batch = 0
while True:
    os.write(progress_fd, b"begin %d\\n" % batch)
    size = rng.randint(50, 1500)
    batch_id = f"{tag}-{batch}".encode()
    session.begin()
    for i in range(size):
        headers = (("batch", batch_id), ("size", b"%d" % size), ("index", b"%d" % i))
        session.produce(Outbound(sink, b"%s/%d" % (batch_id, i), value, headers))
    session.commit({})
    batch += 1
"""


def spawn(script: str, *args: str) -> subprocess.Popen[bytes]:
    """Start ``script`` in a new interpreter that imports this checkout."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.Popen([sys.executable, "-c", script, *args], env=env, stderr=subprocess.PIPE)


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Wait for ``condition`` with a short backoff; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    backoff = 0.001
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(backoff)
        backoff = min(backoff * 2, 0.05)


def read_all(transport: EmbeddedTransport, topic: str) -> dict[int, list[Record]]:
    """Every record of ``topic`` by partition."""
    reader = transport.reader()
    try:
        return {
            p: [r for batch in reader.read(TopicPartition(topic, p), 0) for r in batch]
            for p in range(PARTITIONS)
        }
    finally:
        reader.close()


def total_records(transport: EmbeddedTransport, topic: str) -> int:
    reader = transport.reader()
    try:
        return sum(reader.end_offset(TopicPartition(topic, p)) for p in range(PARTITIONS))
    finally:
        reader.close()


def assert_dense(by_partition: dict[int, list[Record]]) -> None:
    for partition, records in by_partition.items():
        offsets = [r.offset for r in records]
        assert offsets == list(range(len(records))), f"gap or duplicate in partition {partition}"


@pytest.fixture
def log(tmp_path: Path) -> EmbeddedTransport:
    transport = EmbeddedTransport(tmp_path / "log")
    admin = transport.admin()
    admin.create_topics([TopicSpec(t, PARTITIONS) for t in ("source", "sink")])
    admin.close()
    return transport


def commit_batches_until(
    log: EmbeddedTransport, stop: Callable[[], bool], batch: int
) -> list[tuple[TopicPartition, int, bytes]]:
    """Commit transactional batches until ``stop()``; return what was committed where."""
    session = log.session("parent", "parent-1")
    session.subscribe(["source"], lambda _: None, lambda _: None)
    session.poll(1, 0.0)
    committed: list[tuple[TopicPartition, int, bytes]] = []
    while not stop():
        session.begin()
        values = [b"parent:%d" % (len(committed) + i) for i in range(batch)]
        for index, value in enumerate(values):
            session.produce(Outbound("sink", b"parent-%d" % ((len(committed) + index) % 13), value))
        positions = session.commit({})
        committed.extend((tp, offset, v) for (tp, offset), v in zip(positions, values, strict=True))
    session.close()
    return committed


def test_a_producer_process_and_transactional_commits_interleave_without_loss(
    log: EmbeddedTransport,
) -> None:
    child_count = 20_000
    child = spawn(APPENDER, str(log.path), "sink", str(child_count), "97")
    wait_until(lambda: total_records(log, "sink") > 0, 60, "the child's first records")
    committed = commit_batches_until(log, lambda: child.poll() is not None, batch=50)
    _, stderr = child.communicate()
    assert child.returncode == 0, stderr.decode()

    by_partition = read_all(log, "sink")
    assert_dense(by_partition)
    records = [r for rs in by_partition.values() for r in rs]
    values = [r.value or b"" for r in records]
    assert len(values) == len(set(values)) == child_count + len(committed)
    assert {v for v in values if v.startswith(b"child:")} == {
        b"child:%d" % i for i in range(child_count)
    }
    stored = {(r.position, r.offset): r.value for r in records}
    assert all(stored[tp, offset] == value for tp, offset, value in committed)
    assert_per_key_order(records)
    assert_interleaved(by_partition)


def assert_per_key_order(records: list[Record]) -> None:
    """Each key's sequence numbers rise with the offset (one partition per key)."""
    by_key: dict[bytes | None, list[Record]] = defaultdict(list)
    for record in records:
        by_key[record.key].append(record)
    for key, keyed in by_key.items():
        assert len({r.partition for r in keyed}) == 1, key
        keyed.sort(key=lambda r: r.offset)
        sequence = [int((r.value or b"").split(b":")[1]) for r in keyed]
        assert sequence == sorted(sequence), key


def assert_interleaved(by_partition: dict[int, list[Record]]) -> None:
    """Proof that both processes wrote while the other did: origins alternate in a partition."""
    switches = 0
    for records in by_partition.values():
        origins = [(r.value or b"").split(b":")[0] for r in records]
        switches += sum(1 for a, b in itertools.pairwise(origins) if a != b)
    assert switches >= 2, "the two writers never interleaved"


@pytest.mark.parametrize("round_", range(3))
def test_a_process_killed_mid_transaction_leaves_no_partial_batch(
    log: EmbeddedTransport, round_: int, tmp_path: Path
) -> None:
    progress = tmp_path / "progress"
    tag = f"round{round_}"
    child = spawn(BATCH_COMMITTER, str(log.path), "source", "sink", tag, str(progress))
    # Kill at a random point after a random amount of committed work.
    threshold = random.Random().randint(1, 20_000)
    wait_until(
        lambda: total_records(log, "sink") >= threshold or child.poll() is not None,
        120,
        f"{threshold} committed records",
    )
    assert child.poll() is None, child.communicate()[1].decode()
    os.kill(child.pid, signal.SIGKILL)
    child.communicate()
    assert child.returncode == -signal.SIGKILL

    by_partition = read_all(log, "sink")
    assert_dense(by_partition)
    batches = whole_batches([r for rs in by_partition.values() for r in rs])
    in_flight = int(progress.read_text().split()[-1])
    # Every batch before the one in flight committed; that one is whole or absent.
    assert set(range(in_flight)) <= batches <= set(range(in_flight + 1))
    assert_integrity(log)
    assert_still_writable(log)


def whole_batches(records: list[Record]) -> set[int]:
    """The numbers of the batches present; each must hold exactly its declared records."""
    batches: dict[bytes, list[dict[str, bytes]]] = defaultdict(list)
    for record in records:
        headers = dict(record.headers)
        batches[headers["batch"]].append(headers)
    for batch_id, members in batches.items():
        size = int(members[0]["size"])
        indexes = sorted(int(h["index"]) for h in members)
        assert indexes == list(range(size)), f"batch {batch_id!r} is partial"
    return {int(batch_id.rsplit(b"-", 1)[1]) for batch_id in batches}


def assert_integrity(log: EmbeddedTransport) -> None:
    conn = sqlite3.connect(log.db_file)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        conn.close()


def assert_still_writable(log: EmbeddedTransport) -> None:
    before = total_records(log, "sink")
    producer = log.producer()
    producer.produce(Outbound("sink", b"after-kill", b"after"))
    producer.close()
    assert total_records(log, "sink") == before + 1


# Claims records as a worker-group member, says so, then waits to be killed.
CLAIMER = """
import sys, time
from processor.transport.embedded import EmbeddedTransport
from processor.transport.embedded_consumer import EmbeddedConsumer

path, topic = sys.argv[1], sys.argv[2]
transport = EmbeddedTransport(path)
consumer = EmbeddedConsumer(transport.db_file, False, "claimers", [topic], session_timeout_ms=600)
records = consumer.poll(3, 10.0)
print(len(records), flush=True)
time.sleep(600)
"""


def test_records_a_killed_group_member_claimed_go_to_the_next_member(tmp_path: Path) -> None:
    """A worker-group member killed with records claimed and not committed: once its
    session runs out, another member gets them, each once."""
    transport = EmbeddedTransport(tmp_path)
    admin = transport.admin()
    admin.create_topics([TopicSpec("work", 1)])
    admin.close()
    producer = transport.producer()
    for i in range(5):
        producer.produce(Outbound("work", b"k", b"item-%d" % i))
    producer.flush()
    producer.close()
    child = spawn(CLAIMER, str(tmp_path), "work")
    try:
        deadline = time.monotonic() + 60
        claims = sqlite3.connect(transport.db_file)
        while claims.execute("SELECT count(*) FROM member_claims").fetchone()[0] < 3:
            assert time.monotonic() < deadline and child.poll() is None
            time.sleep(0.02)  # the poll interval of a deadline-bounded wait
        claims.close()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        assert child.stderr is not None
        child.stderr.close()
    from processor.transport.embedded_consumer import EmbeddedConsumer

    survivor = EmbeddedConsumer(transport.db_file, False, "claimers", ["work"])
    try:
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < 5:
            assert time.monotonic() < deadline, f"only {got}"
            got += [r.value or b"" for r in survivor.poll(5, 0.2)]
        assert sorted(got) == [b"item-%d" % i for i in range(5)]  # the killed one's too, once
    finally:
        survivor.close()
