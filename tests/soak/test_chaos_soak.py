"""The chaos soak's short form (``tests/soak/chaos.py``): a few minutes in CI.

``PROCESSOR_SOAK_MINUTES`` and ``PROCESSOR_SOAK_SEED`` change its length and seed; the
long form and its figures: BENCHMARKS.md, "Chaos soak".
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cluster.conftest import Cluster
from tests.soak.chaos import FAULTS, MIX, MUST_BE_ZERO, soak

pytestmark = [pytest.mark.kafka, pytest.mark.cluster, pytest.mark.slow]

MINUTES = float(os.environ.get("PROCESSOR_SOAK_MINUTES", "2"))
SEED = int(os.environ.get("PROCESSOR_SOAK_SEED", "20261205"))


def test_chaos_soak_loses_and_duplicates_nothing(
    cluster: Cluster, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    if not cluster.managed:
        pytest.skip("the cluster in use is not compose/local-kafka's: its brokers are not ours")
    report = soak(cluster, tmp_path, MINUTES, SEED, rate=6.0)
    print(json.dumps(report, indent=2))
    record_property("soak", json.dumps(report))
    for count in MUST_BE_ZERO:
        assert report[count] == 0, (count, report)
    assert all(report["replay_verified"]), report
    assert report["passed"] is True
    # The soak did what it claims: faults of several kinds, every pipeline, redrives,
    # events admitted by correlation key, children, emitted events, scheduled runs and
    # segments run in a processor, its facts written in batches.
    assert len(report["faults"]) >= 3, report["faults"]
    assert set(report["faults"]) <= set(FAULTS)
    assert set(MIX) <= set(report["submitted"]), report
    assert report["redrives_sent"] > 0, report
    assert report["events_admitted"] > 0, report
    assert report["children"] > 0, report
    assert report["emitted"] > 0, report
    assert report["scheduled_runs"] > 10, report
    assert report["attempts_run_inline"] > 0, report
    assert report["fact_batches"] > 0, report
