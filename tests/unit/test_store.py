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

from processor.clients.client import Client
from processor.errors import StoreFormatError
from processor.facts.codec import decode_fact, decode_facts, encode
from processor.facts.models import StepCompleted
from processor.model.reduce import fold
from processor.restore.catch_up import catch_up
from processor.store.history import chunk_fact_keys, chunk_facts, encode_chunk
from processor.store.rocks import COLUMN_FAMILIES, FORMAT_VERSION, PartitionStore, open_store
from processor.transport.base import TopicPartition
from processor.transport.topology import Topology
from tests.store_support import TOPIC, simulated_log, store_contents

FACTS = TopicPartition(TOPIC, 0)

fact_specs = st.lists(
    st.tuples(st.text(max_size=30), st.integers(0, 2**40), st.binary(max_size=200)), max_size=12
)


def _step_completed(run_id: str, fact_key: str, seq: int, output: bytes) -> bytes:
    header = {"run_id": run_id, "seq": seq, "fact_key": fact_key, "time_ms": 1, "cause_id": "c"}
    step = {"segment": 0, "attempt": 1, "generation": 1, "step": 0, "output": output}
    return encode(StepCompleted(**header, **step))


@given(st.text(max_size=80), fact_specs)
def test_a_history_chunk_gives_back_the_facts_of_its_run(
    run_id: str, specs: list[tuple[str, int, bytes]]
) -> None:
    facts = [_step_completed(run_id, key, seq, output) for key, seq, output in specs]
    chunk = encode_chunk(run_id, facts)
    assert list(chunk_facts(run_id, chunk)) == facts
    assert list(chunk_fact_keys(chunk)) == [key for key, _, _ in specs]
    # each fact is stored without its run id (at least its one-byte length goes)
    assert len(chunk) <= sum(len(fact) + 4 - 1 - len(run_id.encode()) for fact in facts)


def test_a_chunk_refuses_a_fact_of_another_run() -> None:
    with pytest.raises(ValueError, match="another run"):
        encode_chunk("run-1", [_step_completed("run-2", "s0", 1, b"o")])


def test_a_truncated_history_chunk_is_an_error() -> None:
    facts = [_step_completed("run-1", "s0", 1, b"o"), _step_completed("run-1", "s1", 2, b"p")]
    chunk = encode_chunk("run-1", facts)
    with pytest.raises(ValueError, match="truncated"):
        list(chunk_facts("run-1", chunk[:-1]))
    with pytest.raises(ValueError, match="truncated"):
        list(chunk_fact_keys(chunk[:-1]))


def _format_1_store(path: Path) -> None:
    """A store as format 1 wrote it: a fact_keys family next to the others."""
    _old_store(path, ["runs", "history", "fact_keys", "due", "claims", "meta"], 1)


def _format_3_store(path: Path) -> None:
    """A store as format 3 wrote it: a claims family (written, never read)."""
    _old_store(path, ["runs", "history", "due", "claims", "meta"], 3)


def _old_store(path: Path, names: list[str], version: int) -> None:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    db = Rdict(
        str(path), options=opts, column_families={name: Options(raw_mode=True) for name in names}
    )
    meta = db.get_column_family("meta")
    meta[b"format_version"] = version.to_bytes(8, "big")
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


def test_a_format_3_store_with_its_claims_family_is_rebuilt(tmp_path: Path) -> None:
    _format_3_store(tmp_path / "p0000")
    with pytest.raises(StoreFormatError, match=r"another format.*claims.*rebuilds it"):
        PartitionStore(tmp_path / "p0000", read_only=True)
    store = open_store(tmp_path / "p0000")
    try:
        assert store.facts_offset() == 0  # emptied: catch-up rebuilds it from offset 0
        assert store._cf["meta"].get(b"format_version") == FORMAT_VERSION.to_bytes(8, "big")
    finally:
        store.close()
    assert set(Rdict.list_cf(str(tmp_path / "p0000"))) == {"default", *COLUMN_FAMILIES}
    assert "claims" not in COLUMN_FAMILIES


def test_a_format_4_store_without_the_runs_index_is_rebuilt(tmp_path: Path) -> None:
    _old_store(tmp_path / "p0000", ["runs", "history", "due", "meta"], 4)
    with pytest.raises(StoreFormatError, match=r"another format.*due, history, meta, runs\)"):
        PartitionStore(tmp_path / "p0000", read_only=True)
    store = open_store(tmp_path / "p0000")
    try:
        assert store.facts_offset() == 0  # emptied: catch-up rebuilds it, index and all
        assert store._cf["meta"].get(b"format_version") == (5).to_bytes(8, "big")
    finally:
        store.close()
    assert "index" in set(Rdict.list_cf(str(tmp_path / "p0000")))


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
    end = catch_up(store, reader, FACTS, batch_size=50).facts
    store.close()
    child = textwrap.dedent(
        f"""
        import os
        from pathlib import Path
        from processor.restore.catch_up import catch_up
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
