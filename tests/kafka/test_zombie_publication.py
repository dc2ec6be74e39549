"""A zombie processor's terminal publication never lands after ``TerminalPublicationCompleted``.

Instance A decides a run's terminal publication and freezes (SIGSTOP, heartbeats
and all; tests/apps/publication_crash.py) before it produces it. Instance B takes
the partitions over once A's session times out, publishes, and commits
``TerminalPublicationCompleted`` and ``RunSucceeded``. A resumes (SIGCONT) and
produces its copy, but into its transaction, which B's takeover fenced: it is
aborted, and a read_committed consumer of the output topic sees one record.
(When the publication came from a plain producer outside the transaction, A's copy
landed after B's Completed.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from processor.clients.client import Client
from processor.facts.models import TerminalPublicationCompleted
from processor.transport.base import Record
from processor.transport.deployment import Deployment, ensure_topics
from tests.apps.publication_crash import PAUSE_POINT
from tests.apps.support import read_topic, wait_until
from tests.kafka.conftest import ProcessFactory
from tests.kafka.support import KafkaSpace

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

APP = "tests.apps.publication_crash:app"


def _stopped(pid: int) -> bool:
    """Whether the process is stopped by a signal (state T in /proc)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


def _published(deployment: Deployment, topic: str, run_id: str) -> list[Record]:
    reader = deployment.transport.reader()
    try:
        records = read_topic(reader, topic, deployment.topology.partitions)
        return [r for r in records if r.key == run_id.encode()]
    finally:
        reader.close()


def test_a_zombie_does_not_publish_after_completed(
    space: KafkaSpace, processes: ProcessFactory, tmp_path: Path
) -> None:
    deployment = space.deployment(tmp_path / "client")
    topic = f"{space.prefix}test.published"
    ensure_topics(deployment, [topic])
    client = Client(deployment.transport, deployment.topology, deployment.settings.state_dir)
    zombie, survivor = processes("zombie"), processes("survivor")
    for process in (zombie, survivor):
        process.app = APP
        process.extra_env = {"TEST_PUBLISHED_TOPIC": topic}
    zombie.extra_env["TEST_CRASH_POINT"] = PAUSE_POINT
    everything = set(range(space.partitions))
    try:
        zombie.start()
        wait_until(lambda: zombie.owned() == everything, 60, "the zombie to own all")
        run_id = client.submit("publisher", "hello").run_id
        pid = zombie.proc.pid if zombie.proc is not None else 0
        wait_until(lambda: _stopped(pid), 60, "the zombie to freeze before its publish")
        assert _published(deployment, topic, run_id) == []

        survivor.start()
        assert client.wait(run_id, timeout_s=90).succeeded  # the survivor took over
        assert len(_published(deployment, topic, run_id)) == 1

        zombie.resume()
        wait_until(lambda: zombie.owned() == set(), 60, "the zombie to learn it lost all")
        # Its commit was refused before it learnt it: its copy is in an aborted transaction.
        facts = client.history(run_id)
    finally:
        client.close()
    completed = [f for f in facts if isinstance(f, TerminalPublicationCompleted)]
    assert len(completed) == 1
    assert len(_published(deployment, topic, run_id)) == 1, "published after Completed"
