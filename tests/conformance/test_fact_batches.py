"""Fact batches end to end on both transports (``PROCESSOR_FACT_BATCHES=true``): the
demo's orders through a real processor, workers and the payments responder.

A run's facts of one transaction are one record of runs.facts; everything that reads
the journal still sees every fact once, in order: a run's history, a replay into fresh
stores (verified against the live ones), and pages of the topic.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from processor.clients.client import Client
from processor.clients.external import Responder
from processor.clients.pages import read_topic_page
from processor.config.settings import Settings
from processor.engine.host import Host
from processor.examples.demo import app, payments_simulator
from processor.facts.codec import decode_fact
from processor.facts.fact_batch import is_batch
from processor.facts.models import FactHeader
from processor.facts.topics import TopicName
from processor.restore.replay import replay
from processor.transport.base import Record, TopicPartition
from processor.transport.deployment import Deployment
from processor.transport.fact_batches import FactBatchReader
from tests.apps.support import read_topic

RUNS = 12
WAIT_S = 60.0


@dataclass
class Done:
    deployment: Deployment
    settings: Settings
    run_ids: list[str]


def _settings(kind: str, data_dir: Path) -> tuple[Settings, object]:
    batches = {"fact_batches": True, "partitions": 2}
    if kind == "embedded":
        return Settings(broker=None, data_dir=data_dir, **batches), None
    from tests.kafka.support import KafkaSpace
    from tests.kafka_broker import kafka_bootstrap, unavailable_reason

    bootstrap = kafka_bootstrap()
    if bootstrap is None:
        pytest.skip(unavailable_reason())
    space = KafkaSpace.new(bootstrap, partitions=2)
    return space.settings(data_dir).model_copy(update=batches), space


@pytest.fixture(scope="module", params=["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def done(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Done]:
    """The orders run to their ends with fact batches on; the processor stopped."""
    settings, space = _settings(str(request.param), tmp_path_factory.mktemp("batches"))
    deployment = Deployment.from_settings(settings)
    host = Host(deployment, app, workers=1)
    responder = Responder(
        deployment.transport, deployment.topology, {"payments": payments_simulator}
    )
    responding = threading.Thread(target=responder.run, args=(host.stop_event,), daemon=True)
    client = Client(deployment.transport, deployment.topology, settings.state_dir)
    try:
        host.start()
        responding.start()
        run_ids = [
            client.submit("orders", {"order_id": f"o-{i}", "amount": 10 + i}, wait_s=WAIT_S).run_id
            for i in range(RUNS)
        ]
        for run_id in run_ids:
            assert client.wait(run_id, WAIT_S).status in {"succeeded", "failed"}
    finally:
        client.close()
        host.stop()
        responding.join(10)
    assert not host.errors, host.errors
    try:
        yield Done(deployment, settings, run_ids)
    finally:
        if space is not None:
            space.delete_topics()  # type: ignore[attr-defined]


def _journal(done: Done, *, raw: bool) -> list[Record]:
    reader = done.deployment.transport.reader()
    assert isinstance(reader, FactBatchReader)
    try:
        source = reader.inner if raw else reader
        topology = done.deployment.topology
        return list(read_topic(source, topology.name(TopicName.FACTS), topology.partitions))
    finally:
        reader.close()


def test_a_runs_facts_of_one_transaction_are_one_record(done: Done) -> None:
    records, facts = _journal(done, raw=True), _journal(done, raw=False)
    assert any(is_batch(r.value) for r in records)
    # About fifteen facts a run in three to five transactions: well under half.
    assert len(records) * 2 < len(facts), (len(records), len(facts))
    # Each record holds one run's facts: its key is the run of every fact in it.
    for fact_record in facts:
        assert decode_fact(fact_record.value).run_id.encode() == fact_record.key


def test_every_fact_is_read_once_in_order_with_its_run(done: Done) -> None:
    facts = [decode_fact(r.value) for r in _journal(done, raw=False)]
    by_run: dict[str, list[FactHeader]] = {}
    for fact in facts:
        by_run.setdefault(fact.run_id, []).append(fact)
    assert set(done.run_ids) <= set(by_run)
    assert len({(f.run_id, f.fact_key) for f in facts}) == len(facts)  # no fact twice
    client = Client(done.deployment.transport, done.deployment.topology, done.settings.state_dir)
    try:
        for run_id in done.run_ids:
            seqs = [f.seq for f in by_run[run_id]]
            assert seqs == list(range(1, len(seqs) + 1)), run_id
            assert [f.seq for f in client.history(run_id)] == seqs
            status = client.status(run_id)
            assert status is not None and status.terminal
    finally:
        client.close()


def test_a_replay_of_batched_facts_matches_the_live_stores(done: Done, tmp_path: Path) -> None:
    report = replay(
        done.deployment.transport,
        done.deployment.topology,
        done.settings.state_dir,
        verify=True,
        target_dir=tmp_path / "replayed",
    )
    assert report.verified is True
    assert report.facts == len(_journal(done, raw=False))


def test_pages_of_the_journal_give_every_fact_once(done: Done) -> None:
    topic = done.deployment.topology.name(TopicName.FACTS)
    expected = [r.value for r in _journal(done, raw=False)]
    seen: list[bytes | None] = []
    cursor: str | None = None
    for _ in range(len(expected)):
        page = read_topic_page(
            done.deployment.transport, topic, cursor, 4, shape=lambda value: value
        )
        assert len(page.records) >= 4 or page.next_cursor is None
        seen += page.records
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == expected


def test_a_partition_read_from_inside_the_log_resumes_after_a_whole_record(done: Done) -> None:
    """A catch-up starts at an offset the store applied: always a record's end, so never
    half a batch. Reading from each record's offset gives that record's facts first."""
    topic = done.deployment.topology.name(TopicName.FACTS)
    raw = [r for r in _journal(done, raw=True) if r.partition == 0 and is_batch(r.value)]
    record = raw[len(raw) // 2]
    reader = done.deployment.transport.reader()
    try:
        batch = next(iter(reader.read(TopicPartition(topic, 0), record.offset)))
    finally:
        reader.close()
    facts_here = [r for r in batch if r.offset == record.offset]
    assert len(facts_here) > 1 and batch[0].offset == record.offset
