"""``processor run`` on the embedded log says at start which durability it gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.apps.support import ProcessorProcess

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("fsync", "line"),
    [
        ("false", "durability embedded: a commit survives a process crash, not a power loss"),
        ("true", "durability embedded-fsync: a commit survives a process crash and a power"),
    ],
)
def test_processor_run_logs_its_durability(tmp_path: Path, fsync: str, line: str) -> None:
    processor = ProcessorProcess(tmp_path / "data", tmp_path / "run.log", workers=0)
    processor.extra_env["PROCESSOR_DURABLE_FSYNC"] = fsync
    try:
        processor.start()
        processor.wait_running()
        assert line in processor.log_text()
    finally:
        processor.close()
