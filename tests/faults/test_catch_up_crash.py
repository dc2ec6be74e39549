"""A catch-up killed with SIGKILL mid-way resumes to the store a clean one builds.

Catch-up writes without RocksDB's WAL (a bulk load): what survives a kill is what
RocksDB flushed, and atomic flushes keep every column family, the facts offset
included, at one batch. The child is killed once a read-only look at its store sees
a facts offset (a flush committed mid-way); the reopened store must then stand at a
batch boundary past 0, and catching up the rest must give what a clean catch-up gives.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from processor.restore.catch_up import catch_up
from processor.store.rocks import PartitionStore, stored_facts_offset
from processor.transport.base import TopicPartition
from processor.transport.fact_batches import first_batch_size
from tests.apps.support import wait_until
from tests.store_support import TOPIC, simulated_log, store_contents

FACTS = TopicPartition(TOPIC, 0)
BATCH = 500


def test_a_killed_catch_up_resumes_to_the_same_store(tmp_path: Path) -> None:
    transport, facts = simulated_log(tmp_path, runs=500, copies=40)
    reader = transport.reader()
    reference = PartitionStore(tmp_path / "reference")
    catch_up(reference, reader, FACTS, batch_size=BATCH)
    reference.close()

    killed = tmp_path / "killed"
    child = textwrap.dedent(
        f"""
        from pathlib import Path
        from processor.restore.catch_up import catch_up
        from processor.store.rocks import PartitionStore
        from processor.transport.base import TopicPartition
        from processor.transport.embedded import EmbeddedTransport
        reader = EmbeddedTransport(Path({str(tmp_path / "log")!r})).reader()
        store = PartitionStore(Path({str(killed)!r}))
        # The Python fold: slower, so the kill finds it mid-way.
        catch_up(store, reader, TopicPartition({TOPIC!r}, 0), batch_size={BATCH}, native=False)
        """
    )
    process = subprocess.Popen([sys.executable, "-c", child])
    try:
        wait_until(
            lambda: stored_facts_offset(killed) > 0 or process.poll() is not None,
            120,
            "a flush in the catching-up child",
        )
        assert process.poll() is None, "the catch-up ended before its first flush: more facts"
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()

    resumed_at = store_contents(killed)["facts_offset"]
    assert isinstance(resumed_at, int)
    # Batches end at the journal reader's smaller first one, then every BATCH.
    assert 0 < resumed_at < facts and (resumed_at - first_batch_size(BATCH)) % BATCH == 0
    store = PartitionStore(killed)
    assert catch_up(store, reader, FACTS, batch_size=BATCH).facts == facts - resumed_at
    store.close()
    reader.close()
    assert store_contents(killed) == store_contents(tmp_path / "reference")
