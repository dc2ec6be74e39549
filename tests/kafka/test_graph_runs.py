"""Graph runs (issue 28) in a ``processor run`` process on a real Kafka broker.

The pipelines are ``tests.apps.graph_pipelines``; ``tests/integration/test_graph_runs.py``
has the same rules on the embedded log. Here, on the broker: parallel branches run at
the same time and a join gets their outputs by name; a caught failure's handler output
reaches the join; a finally step runs after a cancel; a fan-out of 40 items never has
more than ``FAN_LIMIT`` open and passes at its tolerance; an await branch in a graph is
answered with the client (its request's resume token) while a step runs beside it; and a
switch's unselected route never runs, even when the processor is killed (SIGKILL) after
the commit that recorded the choice and restarted, and ``replay --verify`` agrees with
the live projections.

The other rules of the embedded-log tests, on the broker: a failure's skip through two
levels and its error branches; finally after the run deadline; a fan-out of 200 items
tolerating 10 % (20 failures pass, 21 fail); compensation across branches in reverse
order of completion; predicates; an Unknown effectful step resolved in its lane; redrive
of only the failed branch; an itemized await under a limit and a tolerance. All share
the module's processor; the crash test runs last (its restart would cost the next test
the workers' group joins).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from processor.clients.client import Client, status_dict
from processor.facts.codec import codec
from processor.facts.models import (
    AttemptOutcomeUnknown,
    BoundaryCompletionAdmitted,
    BoundaryInteractionDispatched,
    BoundaryRequest,
    CatchDecided,
    CompensationStepCompleted,
    FactHeader,
    FanOutItemSettled,
    NodeReady,
    NodeSettled,
    NodeSkipped,
    RouteDecided,
    RunFailed,
    RunRedriven,
    RunStopped,
    RunStopRequested,
    RunSucceeded,
    SegmentAttemptStarted,
    StepCompleted,
)
from processor.facts.topics import TopicName
from processor.model.listing import is_unknown
from processor.transport.base import Reader
from processor.transport.deployment import Deployment
from processor.worker.pipeline import Pipeline
from tests.apps import graph_pipelines
from tests.apps.support import read_topic, run_facts, wait_until
from tests.kafka.support import KafkaProcessorProcess, KafkaSpace, assert_replay_verifies
from tests.kafka_broker import kafka_bootstrap, unavailable_reason

pytestmark = pytest.mark.kafka

APP = "tests.apps.graph_pipelines:app"
WAIT_S = 60.0


@dataclass
class Running:
    """A processor (with its in-process workers) in a Kafka space, and a client of it."""

    space: KafkaSpace
    process: KafkaProcessorProcess
    deployment: Deployment
    client: Client
    reader: Reader

    def facts(self, run_id: str) -> list[FactHeader]:
        return run_facts(self.reader, self.deployment, run_id)

    def wait_fact(self, run_id: str, kind: type[FactHeader]) -> None:
        """Wait until the run has a committed fact of ``kind``."""

        def found() -> bool:
            self.process.check_alive()
            return any(isinstance(f, kind) for f in self.facts(run_id))

        wait_until(found, WAIT_S, f"{kind.__name__} of run {run_id}", max_pause_s=0.05)

    def request(self, run_id: str) -> BoundaryRequest | None:
        """The run's boundary request on boundary.requests (None: not sent yet)."""
        topology = self.deployment.topology
        records = read_topic(self.reader, topology.name(TopicName.REQUESTS), topology.partitions)
        requests = [codec().decode_as(r.value, BoundaryRequest) for r in records]
        return next((r for r in requests if r.run_id == run_id), None)

    def close(self) -> None:
        self.client.close()
        self.reader.close()
        self.process.close()


def _start(space: KafkaSpace, process: KafkaProcessorProcess, client_dir: Path) -> Running:
    process.app = APP
    deployment = space.deployment(client_dir)
    client = Client(deployment.transport, deployment.topology, deployment.settings.state_dir)
    process.start()
    process.wait_running()
    return Running(space, process, deployment, client, deployment.transport.reader())


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """One processor for the tests that kill nothing (each start joins groups: seconds)."""
    bootstrap = kafka_bootstrap()
    if bootstrap is None:
        pytest.skip(unavailable_reason())
    space = KafkaSpace.new(bootstrap)
    root = tmp_path_factory.mktemp("graphs")
    processor = space.process(root / "data", root / "processor.log", workers=2)
    started = _start(space, processor, root / "client")
    try:
        yield started
    finally:
        started.close()
        space.delete_topics()


def _names(pipeline: Pipeline, facts: list[FactHeader], kind: type[FactHeader]) -> list[str]:
    """The step names of ``facts`` of type ``kind``, in history order."""
    steps = [s.spec.name for s in pipeline.steps]
    return [steps[f.step] for f in facts if isinstance(f, kind)]  # type: ignore[attr-defined]


def _skips(pipeline: Pipeline, facts: list[FactHeader]) -> list[tuple[str, str]]:
    steps = [s.spec.name for s in pipeline.steps]
    return [(steps[f.step], f.reason) for f in facts if isinstance(f, NodeSkipped)]


def _assert_bookkeeping(facts: list[FactHeader]) -> None:
    """Gapless, no fact key twice, one NodeReady and one NodeSettled per step that ran
    (a fan-out's items have NodeReady facts of their own; a step whose predicate its
    worker found false has NodeReady, then NodeSkipped instead of NodeSettled)."""
    assert [f.seq for f in facts] == list(range(1, len(facts) + 1))
    assert len({f.fact_key for f in facts}) == len(facts)
    guarded = {
        f.step for f in facts if isinstance(f, NodeSkipped) and f.reason == "predicate_false"
    }
    ready = Counter(
        f.step
        for f in facts
        if isinstance(f, NodeReady) and f.item is None and f.step not in guarded
    )
    settled = Counter(f.step for f in facts if isinstance(f, NodeSettled))
    completed = Counter(f.step for f in facts if isinstance(f, StepCompleted))
    assert set(ready.values()) <= {1} and settled == ready, (ready, settled)
    assert set(completed.values()) <= {1}, completed


def _most_open(facts: list[FactHeader]) -> int:
    """The most fan-out items open at once, from the facts: started, not yet settled."""
    open_items, most = 0, 0
    for fact in facts:
        if isinstance(fact, NodeReady) and fact.item is not None:
            open_items += 1
            most = max(most, open_items)
        elif isinstance(fact, FanOutItemSettled):
            open_items -= 1
    return most


# --- no crash --------------------------------------------------------------------------------


def test_parallel_branches_run_at_the_same_time_and_the_join_gets_both_by_name(
    running: Running,
) -> None:
    """charge and reserve each wait at a barrier (in the worker process) for the other:
    run one after the other, the first would give up there and fail the run."""
    receipt = running.client.submit("parallel", {"total": 10, "items": 2}, wait_s=WAIT_S)
    result = running.client.wait(receipt.run_id, WAIT_S)
    assert result.status == "succeeded", result
    assert result.output == {"confirmed": {"charge": {"charged": 10}, "reserve": {"reserved": 2}}}
    facts = running.facts(receipt.run_id)
    _assert_bookkeeping(facts)
    pipeline = graph_pipelines.parallel
    assert _names(pipeline, facts, NodeReady) == ["begin", "charge", "reserve", "confirm"]
    ready = [f for f in facts if isinstance(f, NodeReady)]
    assert ready[1].cause_id == ready[2].cause_id  # both dispatched by begin's result


def test_a_caught_failure_hands_its_handler_output_to_the_join(running: Running) -> None:
    receipt = running.client.submit("handled", {"sku": "k-1", "broken": True}, wait_s=WAIT_S)
    result = running.client.wait(receipt.run_id, WAIT_S)
    assert result.status == "succeeded", result
    error = {"type": "NonRetryableError", "message": "no price for k-1", "attempt": 1}
    assert result.output == {
        "quote": {
            "price": {"price": 0, "because": error | {"step": "price"}},
            "stock": {"in_stock": "k-1"},
        }
    }
    facts = running.facts(receipt.run_id)
    _assert_bookkeeping(facts)
    pipeline = graph_pipelines.handled
    caught = [f for f in facts if isinstance(f, CatchDecided)]
    assert [(f.step, f.handler) for f in caught] == [(1, 2)]  # price, by fallback
    assert sorted(_names(pipeline, facts, StepCompleted)) == [
        "fallback",
        "fetch",
        "quote",
        "stock",
    ]


def test_finally_runs_after_a_cancel_once_the_running_step_settled(
    running: Running, tmp_path: Path
) -> None:
    gate, began = tmp_path / "gate", tmp_path / "began"
    value = {"gate": str(gate), "began": str(began)}
    run_id = running.client.submit("held", value, wait_s=WAIT_S).run_id
    # A step its worker has not begun may never run once cancelled: wait until it runs.
    wait_until(began.exists, WAIT_S, "slow_step to begin")
    reply = running.client.cancel(run_id, "changed my mind", wait_s=WAIT_S)
    assert reply is not None and reply.refusal is None, reply
    running.wait_fact(run_id, RunStopRequested)
    gate.touch()  # the running step settles; then the finally step runs
    result = running.client.wait(run_id, WAIT_S)
    assert result.status == "cancelled", result
    facts = running.facts(run_id)
    _assert_bookkeeping(facts)
    pipeline = graph_pipelines.held
    assert _names(pipeline, facts, StepCompleted) == ["slow_step", "release"]
    assert "never_reached" not in _names(pipeline, facts, NodeReady)
    stopped = [f for f in facts if isinstance(f, RunStopped)]
    assert [f.execution for f in stopped] == ["Cancelled"]
    assert facts[-1] is stopped[0]


def test_a_fan_out_of_40_items_keeps_its_limit_and_passes_at_its_tolerance(
    running: Running,
) -> None:
    """40 items, ``FAN_TOLERATE`` of them failing (inclusive: the run succeeds), never
    more than ``FAN_LIMIT`` open at once, counted from the facts on the broker."""
    bad = {3, 17, 38}
    assert len(bad) == graph_pipelines.FAN_TOLERATE
    items = [{"i": i, "bad": i in bad, "nap_ms": 5 if i % 4 == 0 else 0} for i in range(40)]
    value = {"items": items}
    receipt = running.client.submit("fanned", value, wait_s=WAIT_S)
    result = running.client.wait(receipt.run_id, WAIT_S)
    assert result.status == "succeeded", result
    assert result.output == graph_pipelines.expected_fanned_result(value)
    facts = running.facts(receipt.run_id)
    _assert_bookkeeping(facts)
    started = [f.item for f in facts if isinstance(f, NodeReady) and f.item is not None]
    settled = [f for f in facts if isinstance(f, FanOutItemSettled)]
    assert started == list(range(40))
    assert sorted(f.item for f in settled) == list(range(40))  # each item once
    assert sorted(f.item for f in settled if f.status == "failed") == sorted(bad)
    assert _most_open(facts) == graph_pipelines.FAN_LIMIT


def test_an_await_branch_of_a_graph_is_answered_on_the_broker(running: Running) -> None:
    """The await ``approve`` waits in its own lane while ``compute`` runs beside it; the
    client answers it with its request's resume token; the join gets both by name."""
    value = {"n": 6}
    run_id = running.client.submit("answered", value, wait_s=WAIT_S).run_id
    request = wait_until(lambda: running.request(run_id), WAIT_S, "the await's request")
    assert request.target == graph_pipelines.GRAPH_APPROVALS
    assert json.loads(request.request) == {"n": 6}
    receipt = running.client.complete(request.resume_token, {"approved": 19}, wait_s=WAIT_S)
    assert receipt.admission == "admitted", receipt
    result = running.client.wait(run_id, WAIT_S)
    assert result.status == "succeeded", result
    assert result.output == graph_pipelines.expected_answered_result(value, {"approved": 19})
    facts = running.facts(run_id)
    _assert_bookkeeping(facts)
    assert len([f for f in facts if isinstance(f, BoundaryCompletionAdmitted)]) == 1
    pipeline = graph_pipelines.answered
    assert sorted(_names(pipeline, facts, StepCompleted)) == [
        "approve",
        "ask",
        "compute",
        "conclude",
        "wrap",
    ]


# --- the rules of the embedded-log tests, on the broker ---------------------------------------


def _wait_facts(
    running: Running, run_id: str, holds: Callable[[list[FactHeader]], bool], what: str
) -> list[FactHeader]:
    """Wait until the run's committed facts satisfy ``holds``; return them."""

    def found() -> list[FactHeader] | None:
        running.process.check_alive()
        facts = running.facts(run_id)
        return facts if holds(facts) else None

    return wait_until(found, WAIT_S, what, max_pause_s=0.05)


def test_a_failure_skips_two_levels_and_runs_its_error_branches(running: Running) -> None:
    failing = running.client.submit("rules", {"fail": True}, wait_s=WAIT_S).run_id
    passing = running.client.submit("rules", {}, wait_s=WAIT_S).run_id
    failed = running.client.wait(failing, WAIT_S)
    assert failed.status == "failed" and failed.error == "work failed", failed
    passed = running.client.wait(passing, WAIT_S)
    assert passed.status == "succeeded", passed
    pipeline = graph_pipelines.rules
    facts = running.facts(failing)
    _assert_bookkeeping(facts)
    assert _skips(pipeline, facts) == [
        ("after_work", "readiness_unsatisfied"),
        ("after_after", "readiness_unsatisfied"),  # the skip propagated a second level
    ]
    assert sorted(_names(pipeline, facts, StepCompleted)) == ["always_report", "on_failure"]
    facts = running.facts(passing)
    _assert_bookkeeping(facts)
    assert _skips(pipeline, facts) == [("on_failure", "readiness_unsatisfied")]
    assert sorted(_names(pipeline, facts, StepCompleted)) == [
        "after_after",
        "after_work",
        "always_report",
        "work",
    ]


def test_finally_runs_after_the_run_deadline(running: Running, tmp_path: Path) -> None:
    """The deadline passes while ``slow_step`` is held at its gate: the run stops once
    the step settled, and the finally step runs then, not fenced by the deadline.

    (On a loaded machine the deadline may pass before a worker began ``slow_step``,
    which then never runs: the finally step must run all the same.)"""
    gate = tmp_path / "gate"
    receipt = running.client.submit("held", {"gate": str(gate)}, deadline_s=2.0, wait_s=WAIT_S)
    run_id = receipt.run_id
    stop = _wait_facts(
        running,
        run_id,
        lambda facts: any(isinstance(f, RunStopRequested) for f in facts),
        "the deadline's stop",
    )
    assert not any(isinstance(f, StepCompleted) for f in stop)  # slow_step is held
    gate.touch()
    result = running.client.wait(run_id, WAIT_S)
    assert result.status == "timed_out", result
    facts = running.facts(run_id)
    _assert_bookkeeping(facts)
    pipeline = graph_pipelines.held
    completed = _names(pipeline, facts, StepCompleted)
    assert completed in (["slow_step", "release"], ["release"]), completed
    assert "never_reached" not in _names(pipeline, facts, NodeReady)
    stopped = [f for f in facts if isinstance(f, RunStopped)]
    assert [f.execution for f in stopped] == ["TimedOut"] and facts[-1] is stopped[0]
    stop_at = next(f.seq for f in facts if isinstance(f, RunStopRequested))
    steps = [s.spec.name for s in pipeline.steps]
    (release,) = [f for f in facts if isinstance(f, NodeReady) and steps[f.step] == "release"]
    assert release.seq > stop_at  # the finally step ran after the deadline's stop


def test_a_fan_out_of_200_items_tolerates_10_percent_failing_and_fails_beyond(
    running: Running,
) -> None:
    """Items ending in 3 fail: 20 of 200 (10 %, inclusive) pass, 21 of 200 fail the
    fan-out. Never more than ``TOLERANT_LIMIT`` open at once, counted from the facts."""
    passing = running.client.submit("tolerant", {"n": 200}, wait_s=WAIT_S).run_id
    failing_input = {"n": 199, "more": [1003]}  # 1003 fails too: 21 of 200
    failing = running.client.submit("tolerant", failing_input, wait_s=WAIT_S).run_id
    passed = running.client.wait(passing, WAIT_S)
    assert passed.status == "succeeded", passed
    assert passed.output["items"] == [None if i % 10 == 3 else i * i for i in range(200)]
    assert [f["item"] for f in passed.output["failed"]] == list(range(3, 200, 10))
    failed = running.client.wait(failing, WAIT_S)
    assert failed.status == "failed", failed
    assert (failed.error or "").startswith("21 of 200 items failed, more than tolerated")
    assert failed.error_type == "FanOutFailed"
    pipeline = graph_pipelines.tolerant
    for run_id in (passing, failing):
        facts = running.facts(run_id)
        _assert_bookkeeping(facts)
        started = [f.item for f in facts if isinstance(f, NodeReady) and f.item is not None]
        settled = [f for f in facts if isinstance(f, FanOutItemSettled)]
        assert started == list(range(200))
        assert sorted(f.item for f in settled) == list(range(200))  # each item once
        assert _most_open(facts) == graph_pipelines.TOLERANT_LIMIT
    assert _skips(pipeline, running.facts(failing)) == [("summarize", "readiness_unsatisfied")]
    failed_items = [
        f.item
        for f in running.facts(failing)
        if isinstance(f, FanOutItemSettled) and f.status == "failed"
    ]
    assert len(failed_items) == 21


def test_compensation_undoes_every_branch_in_reverse_order_of_completion(
    running: Running, tmp_path: Path
) -> None:
    """``book_a`` is held until ``book_b`` completed, so the order of completion is
    open_order, book_b, book_a (not the order of declaration); the unwind reverses it."""
    gate = tmp_path / "gate"
    run_id = running.client.submit("unwind", {"gate": str(gate)}, wait_s=WAIT_S).run_id
    pipeline = graph_pipelines.unwind
    _wait_facts(
        running,
        run_id,
        lambda facts: "book_b" in _names(pipeline, facts, StepCompleted),
        "book_b to complete",
    )
    gate.touch()
    result = running.client.wait(run_id, WAIT_S)
    assert result.status == "failed" and result.error == "settlement refused", result
    facts = running.facts(run_id)
    _assert_bookkeeping(facts)
    completed = _names(pipeline, facts, StepCompleted)
    assert completed == ["open_order", "book_b", "book_a"]
    compensated = _names(pipeline, facts, CompensationStepCompleted)
    assert compensated == ["book_a", "book_b", "open_order"]


def test_a_false_predicate_skips_its_step_durably_and_a_true_one_runs_it(
    running: Running,
) -> None:
    small = running.client.submit("guarded", {"total": 5}, wait_s=WAIT_S).run_id
    big = running.client.submit("guarded", {"total": 500}, wait_s=WAIT_S).run_id
    small_result = running.client.wait(small, WAIT_S)
    big_result = running.client.wait(big, WAIT_S)
    assert small_result.status == "succeeded", small_result
    assert small_result.output == {"notify_manager": None, "receive": {"total": 5}}
    assert big_result.output == {"notify_manager": "notified", "receive": {"total": 500}}
    pipeline = graph_pipelines.guarded
    small_facts, big_facts = running.facts(small), running.facts(big)
    _assert_bookkeeping(small_facts)
    _assert_bookkeeping(big_facts)
    assert _skips(pipeline, small_facts) == [
        ("notify_manager", "predicate_false"),
        ("after_notify", "readiness_unsatisfied"),
    ]
    assert "notify_manager" not in _names(pipeline, small_facts, StepCompleted)
    assert "notify_manager" not in _names(pipeline, small_facts, NodeSettled)
    assert _skips(pipeline, big_facts) == []
    assert "after_notify" in _names(pipeline, big_facts, StepCompleted)


def test_an_unknown_graph_step_is_resolved_in_its_lane_and_the_graph_goes_on(
    running: Running, tmp_path: Path
) -> None:
    """The effectful ``charge_card`` hangs past its timeout: its lane turns Unknown (never
    retried blindly) while ``email`` beside it completes; the operator resolves that
    lane, and the join gets the operator's output. The hung attempt's late result is
    stale."""
    gate = tmp_path / "gate"
    run_id = running.client.submit("effects", {"total": 9, "gate": str(gate)}, wait_s=WAIT_S).run_id
    facts = _wait_facts(
        running,
        run_id,
        lambda facts: any(isinstance(f, AttemptOutcomeUnknown) for f in facts),
        "charge_card's Unknown outcome",
    )
    unknown = next(f for f in facts if isinstance(f, AttemptOutcomeUnknown))
    pipeline = graph_pipelines.effects
    assert pipeline.steps[unknown.step].spec.name == "charge_card"
    state = running.client.status(run_id)
    assert state is not None and is_unknown(state)
    lane = status_dict(state)["graph"]["lanes"][str(unknown.segment)]
    assert lane["phase"] == "unknown", lane
    reply = running.client.resolve(
        run_id,
        segment=unknown.segment,
        attempt=unknown.attempt,
        generation=unknown.generation,
        idempotency_key="charge-checked-by-hand",
        action="succeed",
        output={"charged": 9, "by": "operator"},
        wait_s=WAIT_S,
    )
    assert reply is not None and reply.refusal is None, reply
    gate.touch()  # the hung attempt returns: stale
    result = running.client.wait(run_id, WAIT_S)
    assert result.status == "succeeded", result
    assert result.output == {"charge_card": {"by": "operator", "charged": 9}, "email": "sent"}
    facts = running.facts(run_id)
    _assert_bookkeeping(facts)
    assert len([f for f in facts if isinstance(f, AttemptOutcomeUnknown)]) == 1
    attempts = [f for f in facts if isinstance(f, SegmentAttemptStarted)]
    assert [f.segment for f in attempts].count(unknown.segment) == 1  # not retried


def test_a_failed_graph_run_is_redriven_from_its_failed_branch_only(
    running: Running, tmp_path: Path
) -> None:
    fixed = tmp_path / "fixed"
    run_id = running.client.submit("redrivable", {"fixed": str(fixed)}, wait_s=WAIT_S).run_id
    failed = running.client.wait(run_id, WAIT_S)
    assert failed.status == "failed" and failed.error == "warehouse offline", failed
    fixed.touch()
    reply = running.client.redrive(run_id, operator="ops", reason="warehouse back", wait_s=WAIT_S)
    assert reply is not None and reply.refusal is None, reply
    result = running.client.wait(run_id, WAIT_S)
    assert result.status == "succeeded", result
    assert result.output == {"bill": {"billed": True}, "stock_up": {"stocked": True}}
    facts = running.facts(run_id)
    assert [f.seq for f in facts] == list(range(1, len(facts) + 1))
    assert len({f.fact_key for f in facts}) == len(facts)
    pipeline = graph_pipelines.redrivable
    redriven = next(i for i, f in enumerate(facts) if isinstance(f, RunRedriven))
    # the succeeded branch kept its output and did not run again
    assert sorted(_names(pipeline, facts[redriven:], NodeReady)) == ["ship_it", "stock_up"]
    assert Counter(_names(pipeline, facts, StepCompleted)) == Counter(
        {"start_order": 1, "bill": 1, "stock_up": 1, "ship_it": 1}
    )


def _labels_open(facts: list[FactHeader]) -> int:
    """The most interactions of an itemized await open at once, from the facts:
    dispatched, not yet admitted."""
    open_items, most = 0, 0
    for fact in facts:
        if isinstance(fact, BoundaryInteractionDispatched):
            open_items += 1
            most = max(most, open_items)
        elif isinstance(fact, BoundaryCompletionAdmitted):
            open_items -= 1
    return most


def _answer_labels(running: Running, run_ids: dict[str, set[int]]) -> None:
    """Answer every request of the ``batched`` runs of ``run_ids`` as it opens (all that
    are open at once), failing the items in their set, until each run ended."""
    topology = running.deployment.topology
    topic = topology.name(TopicName.REQUESTS)
    answered: set[tuple[str, int]] = set()

    def answer_open() -> bool:
        running.process.check_alive()
        records = read_topic(running.reader, topic, topology.partitions)
        for request in (codec().decode_as(r.value, BoundaryRequest) for r in records):
            failing = run_ids.get(request.run_id)
            key = (request.run_id, request.item_index)
            if failing is None or request.cancel is not None or key in answered:
                continue
            answered.add(key)
            if request.item_index in failing:
                error = f"printer jammed on {request.item_index}"
                running.client.fail(request.resume_token, error)
            else:
                running.client.complete(request.resume_token, {"label": request.item_index})
        return all(
            any(isinstance(f, RunSucceeded | RunFailed) for f in running.facts(run_id))
            for run_id in run_ids
        )

    wait_until(answer_open, WAIT_S, "the itemized awaits to be answered", max_pause_s=0.05)


def test_an_itemized_await_keeps_its_limit_and_tolerates_one_failure(running: Running) -> None:
    """8 parcels, at most ``BATCH_LIMIT`` requests open at once (counted from the facts,
    every open request answered at once), one failure tolerated, two not."""
    passing = running.client.submit("batched", {"parcels": 8}, wait_s=WAIT_S).run_id
    failing = running.client.submit("batched", {"parcels": 8}, wait_s=WAIT_S).run_id
    _answer_labels(running, {passing: {4}, failing: {2, 5}})
    result = running.client.wait(passing, WAIT_S)
    assert result.status == "succeeded", result
    labels = [None if i == 4 else {"label": i} for i in range(8)]
    assert result.output == {
        "failed": [{"error": "printer jammed on 4", "item": 4}],
        "items": labels,
    }
    failed = running.client.wait(failing, WAIT_S)
    assert failed.status == "failed", failed
    assert (failed.error or "").startswith("2 of 8 items failed, more than tolerated")
    facts = running.facts(passing)
    assert _labels_open(facts) == graph_pipelines.BATCH_LIMIT
    dispatched = [f.item_index for f in facts if isinstance(f, BoundaryInteractionDispatched)]
    assert dispatched == list(range(8))
    assert len([f for f in facts if isinstance(f, BoundaryCompletionAdmitted)]) == 8
    assert _labels_open(running.facts(failing)) <= graph_pipelines.BATCH_LIMIT


# --- a crash after the route was decided -----------------------------------------------------


def test_an_unselected_route_never_runs_even_after_a_crash_and_a_replay(
    running: Running, tmp_path: Path
) -> None:
    """kill -9 the processor once the commit that recorded the switch's choice is in the
    journal (the chosen route still running, held at its gate), start it again: the run
    finishes on the route taken, the other never dispatched, skipped once.

    Two more graph runs are in flight at the kill, sharing its restart: a fan-out whose
    first ``FAN_LIMIT`` items are open (held at the same gate), and an await branch that
    asked and waits for its answer (sent after the restart). Each item starts and
    settles once, never more than ``FAN_LIMIT`` open, and the answer is admitted once.

    It uses the module's processor (a start of its own would cost the file seconds) and
    leaves it running for any test after it."""
    processor = running.process
    gate = tmp_path / "gate"
    value = {"choose": "refund", "amount": 5, "gate": str(gate)}
    run_id = running.client.submit("routes", value, wait_s=WAIT_S).run_id
    items = [{"i": i, "bad": i == 7, "nap_ms": 0, "gate": str(gate)} for i in range(12)]
    fan_value = {"items": items}
    fan_id = running.client.submit("fanned", fan_value, wait_s=WAIT_S).run_id
    await_value = {"n": 2}
    await_id = running.client.submit("answered", await_value, wait_s=WAIT_S).run_id
    running.wait_fact(run_id, RouteDecided)
    request = wait_until(lambda: running.request(await_id), WAIT_S, "the await's request")

    def items_open() -> bool:
        facts = running.facts(fan_id)
        started = [f for f in facts if isinstance(f, NodeReady) and f.item is not None]
        return len(started) == graph_pipelines.FAN_LIMIT

    wait_until(items_open, WAIT_S, "the fan-out's first items to start", max_pause_s=0.05)
    before = running.facts(run_id)
    assert processor.kill() == -9
    assert not any(isinstance(f, RunSucceeded) for f in before)
    assert "refund" in _names(graph_pipelines.routes, before, NodeReady)
    fan_before = running.facts(fan_id)
    assert not any(isinstance(f, FanOutItemSettled) for f in fan_before)  # held at the gate

    gate.touch()
    processor.start()
    answered = running.client.complete(request.resume_token, {"approved": 7}, wait_s=WAIT_S)
    assert answered.admission == "admitted", answered
    result = running.client.wait(run_id, WAIT_S)
    assert result.status == "succeeded", result
    assert result.output == {"refund": {"refunded": 5}, "reship": None}
    facts = running.facts(run_id)
    _assert_bookkeeping(facts)
    pipeline = graph_pipelines.routes
    assert [f.routes for f in facts if isinstance(f, RouteDecided)] == [("refund",)]
    assert "reship" not in _names(pipeline, facts, NodeReady)
    assert "reship" not in _names(pipeline, facts, StepCompleted)
    assert _skips(pipeline, facts) == [("reship", "predicate_false")]
    assert _names(pipeline, facts, StepCompleted)[-1] == "audit"  # finally: the last

    fan_result = running.client.wait(fan_id, WAIT_S)
    assert fan_result.status == "succeeded", fan_result
    assert fan_result.output == graph_pipelines.expected_fanned_result(fan_value)
    fan_facts = running.facts(fan_id)
    _assert_bookkeeping(fan_facts)
    started = [f.item for f in fan_facts if isinstance(f, NodeReady) and f.item is not None]
    settled = [f.item for f in fan_facts if isinstance(f, FanOutItemSettled)]
    assert started == list(range(12)) and sorted(settled) == list(range(12))
    assert _most_open(fan_facts) == graph_pipelines.FAN_LIMIT
    await_result = running.client.wait(await_id, WAIT_S)
    assert await_result.status == "succeeded", await_result
    assert await_result.output == graph_pipelines.expected_answered_result(
        await_value, {"approved": 7}
    )
    await_facts = running.facts(await_id)
    _assert_bookkeeping(await_facts)
    assert len([f for f in await_facts if isinstance(f, BoundaryCompletionAdmitted)]) == 1
    # Rebuilt from the journal, the projections equal the live ones (read while the
    # processor runs on: replay compares one consistent view of each live store).
    processor.check_alive()
    assert_replay_verifies(running.space, processor.data_dir)
