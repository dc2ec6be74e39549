"""A reader (RocksDB secondary instance) follows a store its writer keeps open."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from processor.model.listing import index_entries
from processor.model.state import RunState
from processor.store.listing import RunQuery, list_runs
from processor.store.readers import (
    LocalStores,
    StoreReplacedError,
    open_reader,
    open_readers,
    readers_dir,
    refresh,
    store_partitions,
)
from processor.store.rocks import PartitionStore, store_path


def _state(run_id: str, submitted_ms: int) -> RunState:
    return RunState(
        run_id=run_id,
        pipeline="p",
        pipeline_version=1,
        input=b"",
        submitted_ms=submitted_ms,
        created_ms=submitted_ms,
        updated_ms=submitted_ms,
        submit_command_id="c",
        last_output=b"",
    )


def _write(store: PartitionStore, state: RunState, offset: int) -> None:
    batch = store.batch()
    batch.put_run(state)
    for entry in index_entries(state):
        batch.put_index(entry)
    batch.set_facts_offset(offset)
    store.write(batch)


def _listed(reader: PartitionStore) -> list[str]:
    return [run.run_id for run in list_runs([reader], RunQuery(), None, 100).runs]


def test_there_is_no_reader_of_a_store_that_is_not_there(tmp_path: Path) -> None:
    assert open_reader(store_path(tmp_path, 0)) is None


def test_a_reader_sees_what_the_writer_wrote_after_it_opened(tmp_path: Path) -> None:
    path = store_path(tmp_path, 0)
    writer = PartitionStore(path)
    try:
        _write(writer, _state("first", 1), 1)
        reader = open_reader(path)
        assert reader is not None
        try:
            assert _listed(reader) == ["first"]
            _write(writer, _state("second", 2), 2)
            assert _listed(reader) == ["first"]  # as of its last refresh
            refresh(reader)
            assert _listed(reader) == ["second", "first"]
            assert reader.facts_offset() == 2
            writer.persist()  # flushed to table files, the write-ahead log moves on
            _write(writer, _state("third", 3), 3)
            refresh(reader)
            assert _listed(reader) == ["third", "second", "first"]
            assert reader.run("third") == _state("third", 3)
        finally:
            reader.close()
    finally:
        writer.close()
    assert not any(readers_dir(path).iterdir())  # its scratch directory went with it


def test_a_reader_goes_on_after_the_writer_reopens(tmp_path: Path) -> None:
    path = store_path(tmp_path, 0)
    writer = PartitionStore(path)
    _write(writer, _state("first", 1), 1)
    reader = open_reader(path)
    assert reader is not None
    try:
        writer.close()
        writer = PartitionStore(path)
        _write(writer, _state("second", 2), 2)
        refresh(reader)
        assert _listed(reader) == ["second", "first"]
    finally:
        reader.close()
        writer.close()


def test_a_rebuilt_store_is_refused_by_its_reader_and_reopened_by_local_stores(
    tmp_path: Path,
) -> None:
    path = store_path(tmp_path, 0)
    writer = PartitionStore(path)
    _write(writer, _state("old", 1), 1)
    reader = open_reader(path)
    local = LocalStores(tmp_path)
    assert reader is not None
    try:
        assert [_listed(s) for s in local.refresh()] == [["old"]]
        writer.close()
        shutil.rmtree(path)  # what open_store does to a store of another format
        writer = PartitionStore(path)
        _write(writer, _state("new", 2), 1)
        with pytest.raises(StoreReplacedError, match="removed or rebuilt"):
            refresh(reader)
        assert [_listed(s) for s in local.refresh()] == [["new"]]
    finally:
        reader.close()
        local.close()
        writer.close()


def test_local_stores_open_the_stores_that_appear(tmp_path: Path) -> None:
    local = LocalStores(tmp_path / "state")
    writers = []
    try:
        assert local.refresh() == []
        for partition in (1, 0):
            writers.append(PartitionStore(store_path(tmp_path / "state", partition)))
            _write(writers[-1], _state(f"in-{partition}", partition), 1)
        stores = local.refresh()
        assert [s.path.name for s in stores] == ["p0000", "p0001"]
        assert [_listed(s) for s in stores] == [["in-0"], ["in-1"]]
    finally:
        local.close()
        for writer in writers:
            writer.close()


def test_readers_of_the_partitions_asked_for_only(tmp_path: Path) -> None:
    """A partition revoked (no longer asked for) has its reader closed, its store kept;
    assigned again, it is read again."""
    state_dir = tmp_path / "state"
    writers = [PartitionStore(store_path(state_dir, p)) for p in range(3)]
    local = LocalStores(state_dir)
    try:
        for partition, writer in enumerate(writers):
            _write(writer, _state(f"in-{partition}", partition), 1)
        assert store_partitions(local.refresh()) == [0, 1, 2]
        assert store_partitions(local.refresh({0, 2})) == [0, 2]
        assert store_partitions(local.refresh(set())) == []
        assert [_listed(s) for s in local.refresh([1])] == [["in-1"]]
        assert [_listed(s) for s in local.refresh()] == [["in-0"], ["in-1"], ["in-2"]]
        once = open_readers(state_dir, {2, 5})
        assert store_partitions(once) == [2]
        for reader in once:
            reader.close()
    finally:
        local.close()
        for writer in writers:
            writer.close()
