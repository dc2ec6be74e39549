"""What README.md says about the code, checked against the code: the metrics table
against the metrics the processor registers, and the compiled fold's coverage against
what the installed extension folds."""

from __future__ import annotations

import re
from collections.abc import Iterable

import pytest
from prometheus_client.metrics_core import Metric

from processor.facts.models import FACT_TYPES
from processor.store.native_fold import covered_fact_types, native_fold_available
from processor.telemetry.metrics import REGISTRY
from processor.transport.topology import Topology
from processor.web.collector import processor_collectors
from tests.wheel_support import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()


class _UnusedReader:
    """The collectors read partition ends only for a running loop: none here."""

    def close(self) -> None:
        pass


def _exposed(families: Iterable[Metric]) -> dict[str, str]:
    """Metric name as scraped (a counter's with ``_total``) -> its type."""
    return {f.name + ("_total" if f.type == "counter" else ""): f.type for f in families}


def _registered() -> dict[str, str]:
    """The metrics of ``REGISTRY`` and of the collectors a processor registers."""
    collectors = processor_collectors(lambda: None, _UnusedReader(), Topology())
    families = [*REGISTRY.collect(), *(f for c in collectors for f in c.collect())]
    return _exposed(families)


def _readme_metrics() -> dict[str, str]:
    """The README's metrics table: name -> the type its second column starts with."""
    table = README[README.index("| metric | type, labels | what |") :].split("\n\n", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| (\w+)", table, flags=re.MULTILINE)
    assert rows, "no metrics table in README.md"
    return dict(rows)


def test_the_readme_metrics_table_lists_every_registered_metric() -> None:
    registered = _registered()
    assert len(registered) >= 20  # the static metrics and the scrape-time gauges
    assert _readme_metrics() == registered


@pytest.mark.skipif(
    not native_fold_available(), reason="the compiled fold is not installed (no cargo)"
)
def test_the_readme_states_the_compiled_folds_coverage() -> None:
    covered = {model.__name__ for model in covered_fact_types()}
    every = {model.__name__ for model in FACT_TYPES}
    stated = re.search(
        r"covers the current schema of (\d+) of the (\d+) fact types in\s+`FACT_TYPES`[^:]*:"
        r"\s+every one but ((?:`\w+`(?:,\s+|\s+and\s+)?)+)",
        README,
    )
    assert stated is not None, "README.md no longer says how many fact types it covers"
    not_covered = set(re.findall(r"`(\w+)`", stated.group(3)))
    assert (int(stated.group(1)), int(stated.group(2))) == (len(covered), len(every))
    assert not_covered == every - covered
    # Every other place that names a fact type the compiled fold does not know agrees.
    unknown = set(re.findall(r"compiled fold[^.]*?does not (?:know|cover) `(\w+)`", README))
    assert unknown and unknown <= every - covered, unknown
