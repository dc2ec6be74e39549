"""Worker metrics recorded in a child process reach the parent's registry (``Relay``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from processor.telemetry import metrics
from processor.telemetry.metrics import REGISTRY, Relay


@pytest.fixture
def relay() -> Iterator[Relay]:
    held = Relay()
    metrics.relay_to(held)
    try:
        yield held
    finally:
        metrics.relay_to(None)


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_relay_holds_what_a_worker_records_until_the_parent_applies_it(relay: Relay) -> None:
    step = {"pipeline": "relayed", "step": "one"}
    before = (
        _value("processor_step_duration_seconds_count", **step),
        _value("processor_step_duration_seconds_sum", **step),
        _value("processor_step_deadline_warnings_total", **step),
        _value("processor_rejected_inputs_total", reason="relayed_reason"),
    )
    metrics.observe_step("relayed", "one", 0.25)
    metrics.observe_step("relayed", "one", 0.5)
    metrics.count_deadline_warning("relayed", "one")
    metrics.count_worker_rejection("relayed_reason")
    unchanged = (
        _value("processor_step_duration_seconds_count", **step),
        _value("processor_step_duration_seconds_sum", **step),
        _value("processor_step_deadline_warnings_total", **step),
        _value("processor_rejected_inputs_total", reason="relayed_reason"),
    )
    assert unchanged == before  # held, not recorded here

    taken = relay.take()
    assert len(taken) == 4
    assert relay.take() == []  # taken once
    metrics.relay_to(None)
    metrics.apply_relayed([*taken, ("a_newer_metric", ("x",), 1.0)])  # unknown: skipped
    after = (
        _value("processor_step_duration_seconds_count", **step),
        _value("processor_step_duration_seconds_sum", **step),
        _value("processor_step_deadline_warnings_total", **step),
        _value("processor_rejected_inputs_total", reason="relayed_reason"),
    )
    assert after == (before[0] + 2, before[1] + 0.75, before[2] + 1, before[3] + 1)
