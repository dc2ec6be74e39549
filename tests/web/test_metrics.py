"""/metrics after N demo runs, on both transports: counts, histograms and lags."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest

from processor.clients.external import Responder
from processor.examples.demo import payments_simulator
from tests.apps.support import wait_until
from tests.web.support import Served, metrics, sample, series, submit

RUNS = 8


@pytest.fixture
def responder(fresh: Served) -> Iterator[None]:
    """The demo's payment system answering boundary.requests from this process."""
    d = fresh.deployment
    group = f"web-responders-{uuid.uuid4().hex[:8]}"
    answering = Responder(d.transport, d.topology, {"payments": payments_simulator}, group=group)
    stop = threading.Event()
    thread = threading.Thread(target=answering.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(30)


@pytest.mark.usefixtures("responder")
def test_n_runs_are_counted_timed_and_the_lags_return_to_zero(fresh: Served) -> None:
    http = fresh.http()
    for i in range(RUNS):
        submit(http, "orders", {"order_id": f"m-{i}", "amount": 10 + i})

    def finished() -> dict:
        found = metrics(http)
        done = sample(
            found, "processor_runs_finished_total", pipeline="orders", outcome="succeeded"
        )
        # The workers' child process relays its step metrics every half second.
        last = sample(
            found, "processor_step_duration_seconds_count", pipeline="orders", step="invoice"
        )
        return found if done >= RUNS and last >= RUNS else {}

    found = wait_until(finished, 120, f"{RUNS} runs succeeded", max_pause_s=0.5)
    labels = {"pipeline": "orders", "outcome": "succeeded"}
    assert sample(found, "processor_runs_finished_total", **labels) == RUNS
    assert sample(found, "processor_runs_started_total", pipeline="orders") == RUNS
    assert sample(found, "processor_run_duration_seconds_count", **labels) == RUNS
    assert sample(found, "processor_run_duration_seconds_sum", **labels) > 0
    for step in ("validate", "capture_payment", "invoice"):
        count = sample(found, "processor_step_duration_seconds_count", pipeline="orders", step=step)
        assert count == RUNS, step
    # one in five orders fails reserve_stock once: at least N tries of it
    tries = sample(
        found, "processor_step_duration_seconds_count", pipeline="orders", step="reserve_stock"
    )
    assert tries >= RUNS
    assert sample(found, "processor_transaction_commit_seconds_count") > 0
    assert (
        sample(found, "processor_transaction_inputs_sum") >= 3 * RUNS
    )  # submit, results, completion

    def settled() -> dict:
        now = metrics(http)
        lags = {
            **series(now, "processor_consumer_lag"),
            **series(now, "processor_projection_lag_facts"),
        }
        return now if lags and not any(lags.values()) else {}

    now = wait_until(settled, 60, "every lag back to 0", max_pause_s=0.5)
    consumer = series(now, "processor_consumer_lag")
    topics = {dict(labels)["topic"] for labels in consumer}
    prefix = fresh.deployment.topology.name
    from processor.facts.topics import TopicName

    assert {
        prefix(TopicName.COMMANDS),
        prefix(TopicName.RESULTS),
        prefix(TopicName.COMPLETIONS),
    } <= topics
    assert len(series(now, "processor_projection_lag_facts")) == 4
    assert sample(now, "processor_runs_waiting", target="payments") == 0
    assert sample(now, "processor_unknown_attempts") == 0
    assert sample(now, "processor_partitions_restoring") == 0
