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
from tests.soak.chaos import FAULTS, soak

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
    assert report["lost"] == 0, report
    assert report["duplicated"] == 0, report
    assert report["duplicated_fact_keys"] == 0, report
    assert report["sequence_gaps"] == 0, report
    assert report["unknown_runs"] == 0, report
    assert all(report["replay_verified"]), report
    assert report["passed"] is True
    # The soak did what it claims: faults of several kinds, every pipeline, redrives.
    assert len(report["faults"]) >= 3, report["faults"]
    assert set(report["faults"]) <= set(FAULTS)
    assert {"orders", "fanned", "branchy", "mend"} <= set(report["submitted"]), report
    assert report["redrives_sent"] > 0, report
