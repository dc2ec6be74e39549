"""A timer decision that raises in a real ``processor run`` on Kafka: quarantined, not
stopped; released; ``replay --verify`` (the scenario of
``tests/integration/test_cli_quarantine.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_cli_quarantine import APP, quarantine_scenario
from tests.kafka.support import KafkaSpace

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_a_raising_timer_decision_quarantines_the_run_not_the_processor(
    space: KafkaSpace, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    process = space.process(data_dir, tmp_path / "processor.log")
    process.app = APP
    quarantine_scenario(process, lambda *args: space.cli(data_dir, *args), tmp_path / "bug-present")
