"""The partition store's format: history chunks, format versions, durable catch-up."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rocksdict import Options, Rdict

from processor.client import Client
from processor.errors import StoreFormatError
from processor.facts.codec import decode_fact, decode_facts
from processor.model.reduce import fold
from processor.restore import catch_up
from processor.store.history import chunk_entries, chunk_fact_keys, encode_chunk
from processor.store.rocks import COLUMN_FAMILIES, PartitionStore, open_store
from processor.topology import Topology
from processor.transport.base import TopicPartition
from tests.store_support import TOPIC, simulated_log, store_contents

FACTS = TopicPartition(TOPIC, 0)

entries = st.lists(st.tuples(st.text(max_size=30), st.binary(max_size=300)), max_size=20)


@given(entries)
def test_a_history_chunk_gives_back_its_entries(chunk: list[tuple[str, bytes]]) -> None:
    assert list(chunk_entries(encode_chunk(chunk))) == chunk
    assert list(chunk_fact_keys(encode_chunk(chunk))) == [fact_key for fact_key, _ in chunk]


def test_a_truncated_history_chunk_is_an_error() -> None:
    chunk = encode_chunk([("submitted", b"a fact"), ("step/0/completed", b"another")])
    with pytest.raises(ValueError, match="truncated"):
        list(chunk_entries(chunk[:-1]))
    with pytest.raises(ValueError, match="truncated"):
        list(chunk_fact_keys(chunk[:-1]))


def _format_1_store(path: Path) -> None:
    """A store as format 1 wrote it: a fact_keys family next to the others."""
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    names = ["runs", "history", "fact_keys", "due", "claims", "meta"]
    db = Rdict(
        str(path), options=opts, column_families={name: Options(raw_mode=True) for name in names}
    )
    meta = db.get_column_family("meta")
    meta[b"format_version"] = (1).to_bytes(8, "big")
    meta[b"facts_offset"] = (42).to_bytes(8, "big")
    del meta
    db.close()


def test_a_store_of_another_format_is_refused_for_reading(tmp_path: Path) -> None:
    _format_1_store(tmp_path / "p0000")
    with pytest.raises(StoreFormatError, match=r"another format.*fact_keys.*rebuilds it"):
        PartitionStore(tmp_path / "p0000", read_only=True)


def test_a_store_of_another_format_is_rebuilt_for_writing(tmp_path: Path) -> None:
    _format_1_store(tmp_path / "p0000")
    store = open_store(tmp_path / "p0000")
    try:
        assert store.facts_offset() == 0  # emptied: catch-up rebuilds it from offset 0
    finally:
        store.close()
    assert set(Rdict.list_cf(str(tmp_path / "p0000"))) == {"default", *COLUMN_FAMILIES}


def test_a_later_format_version_is_refused(tmp_path: Path) -> None:
    store = PartitionStore(tmp_path / "p0000")
    store._cf["meta"][b"format_version"] = (99).to_bytes(8, "big")
    store.close()
    with pytest.raises(StoreFormatError, match="format 99"):
        PartitionStore(tmp_path / "p0000")


def test_a_catch_up_is_on_disk_when_it_returns(tmp_path: Path) -> None:
    """Catch-up writes without the WAL; it persists before it returns, so a process
    that dies right after (no close, no flush) keeps everything it caught up."""
    transport, facts = simulated_log(tmp_path, runs=60)
    reference = tmp_path / "reference"
    store = PartitionStore(reference)
    reader = transport.reader()
    end = catch_up(store, reader, FACTS, batch_size=50)
    store.close()
    child = textwrap.dedent(
        f"""
        import os
        from pathlib import Path
        from processor.restore import catch_up
        from processor.store.rocks import PartitionStore
        from processor.transport.base import TopicPartition
        from processor.transport.embedded import EmbeddedTransport
        reader = EmbeddedTransport(Path({str(tmp_path / "log")!r})).reader()
        store = PartitionStore(Path({str(tmp_path / "killed")!r}))
        catch_up(store, reader, TopicPartition({TOPIC!r}, 0), batch_size=50)
        os._exit(0)  # no close: only what catch-up made durable survives
        """
    )
    subprocess.run([sys.executable, "-c", child], check=True, timeout=120)
    assert store_contents(tmp_path / "killed") == store_contents(reference)
    assert store_contents(reference)["facts_offset"] == end == facts
    reader.close()


def test_a_client_reads_the_log_past_a_store_of_another_format(tmp_path: Path) -> None:
    """``status``/``history`` on a machine whose store an older release wrote: the run
    is folded from runs.facts, as on a machine without a store."""
    transport, _ = simulated_log(tmp_path, runs=4)
    reader = transport.reader()
    values = [value for values, _ in reader.read_values(FACTS, 0) for value in values if value]
    reader.close()
    by_run: dict[str, list[bytes]] = {}
    for value in values:
        by_run.setdefault(decode_fact(value).run_id, []).append(value)
    _format_1_store(tmp_path / "state" / "p0000")
    client = Client(transport, Topology(partitions=1), tmp_path / "state")
    for run_id, run_values in by_run.items():
        view = client.current(run_id)
        assert view.state is not None and view.state == fold(decode_facts(run_values))
        assert view.history == run_values
