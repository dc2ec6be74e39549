"""A reader (RocksDB secondary instance) follows a store its writer keeps open."""

from __future__ import annotations

from pathlib import Path

from processor.model.listing import index_entries
from processor.model.state import RunState
from processor.store.listing import RunQuery, list_runs
from processor.store.readers import open_reader, readers_dir, refresh
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
