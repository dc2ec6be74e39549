"""Logs of simulated facts and the contents of partition stores, for store tests."""

from __future__ import annotations

import uuid
from pathlib import Path

from processor.facts.codec import encode
from processor.store.rocks import COLUMN_FAMILIES, PartitionStore
from processor.transport.base import Outbound, TopicSpec
from processor.transport.embedded import EmbeddedTransport
from tests.unit.simulation import Simulation

TOPIC = "runs.facts"


def simulated_log(tmp_path: Path, runs: int, copies: int = 1) -> tuple[EmbeddedTransport, int]:
    """A one-partition runs.facts of ``runs`` simulated runs (some keyed, some failing,
    some retried), their facts copied ``copies`` times under new run ids (same length,
    so the encoded values stay valid); returns the transport and the facts written."""
    sim = Simulation()
    for n in range(runs):
        run_id = sim.submit(f"key-{n}" if n % 3 == 0 else None, value=n)
        sim.result(run_id, fail=n % 4 == 0, progress=1)
    sim.advance(60_000)
    template = [(fact.run_id, encode(fact)) for fact in sim.facts]
    transport = EmbeddedTransport(tmp_path / "log", default_partitions=1)
    admin = transport.admin()
    admin.create_topics([TopicSpec(TOPIC, 1)])
    admin.close()
    producer = transport.producer()
    for copy in range(copies):
        renamed: dict[str, str] = {}
        for run_id, value in template:
            new_id = renamed.setdefault(
                run_id,
                run_id if copy == 0 else str(uuid.uuid5(uuid.NAMESPACE_OID, f"{copy}/{run_id}")),
            )
            assert len(new_id) == len(run_id)
            producer.produce(
                Outbound(TOPIC, new_id.encode(), value.replace(run_id.encode(), new_id.encode()))
            )
    producer.close()
    return transport, len(template) * copies


def store_contents(path: Path) -> dict[str, object]:
    """Every row of the store at ``path``, each run's history as its facts (whatever
    the chunks), and its facts offset."""
    store = PartitionStore(path, read_only=True)
    try:
        rows: dict[str, object] = {
            family: list(store.items(family))
            for family in COLUMN_FAMILIES
            if family not in ("history", "meta")
        }
        rows["history"] = list(store.histories())
        rows["facts_offset"] = store.facts_offset()
        return rows
    finally:
        store.close()
