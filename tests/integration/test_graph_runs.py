"""Graph runs on the embedded log (issue 28): parallel steps, readiness rules, skips,
routes, catch handlers, finally steps, stops and compensation across branches.

Every assertion reads the run's facts or outcome: which steps ran (``NodeReady``),
which were skipped and why (``NodeSkipped``), the route chosen (``RouteDecided``), the
handler that took over (``CatchDecided``).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from processor import LocalEnvironment
from processor.clients.client import status_dict
from processor.errors import ConfigurationError
from processor.facts.models import (
    AttemptOutcomeUnknown,
    BoundaryCompletionAdmitted,
    BoundaryDispatchCompleted,
    CatchDecided,
    CompensationStepCompleted,
    FactHeader,
    FanOutItemSettled,
    NodeReady,
    NodeSettled,
    NodeSkipped,
    RetryScheduled,
    RouteDecided,
    RunStopped,
    SegmentAttemptStarted,
    SegmentSuspended,
    StepCompleted,
)
from processor.facts.payload import derive_run_id
from processor.model.listing import is_unknown
from processor.model.pipeline_spec import CheckpointSpec, RetryPolicy
from processor.worker.pipeline import Application, NonRetryableError, Pipeline
from tests.apps.label_pipelines import answer_all, batched

ONCE = RetryPolicy(max_attempts=1)


def _names(pipeline: Pipeline, facts: Sequence[FactHeader], kind: type[FactHeader]) -> list[str]:
    """The step names of ``facts`` of type ``kind``, in history order."""
    steps = [s.spec.name for s in pipeline.steps]
    return [steps[f.step] for f in facts if isinstance(f, kind)]  # type: ignore[attr-defined]


def _skips(pipeline: Pipeline, facts: list[FactHeader]) -> dict[str, str]:
    steps = [s.spec.name for s in pipeline.steps]
    return {steps[f.step]: f.reason for f in facts if isinstance(f, NodeSkipped)}


# --- parallel branches and joins -------------------------------------------------------------

_both_in = threading.Barrier(2, timeout=10)
parallel = Pipeline("parallel")


@parallel.step()
def begin(order: dict[str, Any]) -> dict[str, Any]:
    return order


@parallel.step(needs=["begin"], retry=ONCE)
def charge(order: dict[str, Any]) -> dict[str, Any]:
    _both_in.wait()  # returns only while reserve runs too: they overlap
    return {"charged": order["total"]}


@parallel.step(needs=["begin"], retry=ONCE)
def reserve(order: dict[str, Any]) -> dict[str, Any]:
    _both_in.wait()
    return {"reserved": order["items"]}


@parallel.step(needs=["charge", "reserve"])
def confirm(outputs: dict[str, Any]) -> dict[str, Any]:
    return {"confirmed": outputs}


@pytest.fixture
def env_parallel() -> Iterator[LocalEnvironment]:
    _both_in.reset()
    with LocalEnvironment(Application([parallel])) as env:
        yield env


def test_independent_steps_run_at_the_same_time_and_a_join_gets_both_by_name(
    env_parallel: LocalEnvironment,
) -> None:
    """charge and reserve each wait at a barrier for the other: run one after the other,
    the first would time out there and fail the run."""
    run_id = env_parallel.submit("parallel", {"total": 10, "items": 2})
    result = env_parallel.wait(run_id)
    assert result.status == "succeeded", result
    assert result.output == {"confirmed": {"charge": {"charged": 10}, "reserve": {"reserved": 2}}}
    facts = env_parallel.history(run_id)
    ready = [f for f in facts if isinstance(f, NodeReady)]
    assert _names(parallel, facts, NodeReady) == ["begin", "charge", "reserve", "confirm"]
    assert ready[1].cause_id == ready[2].cause_id  # both dispatched by begin's result
    lanes = {f.segment for f in facts if isinstance(f, SegmentAttemptStarted)}
    assert lanes == {1, 2, 3, 4}  # a lane (segment) per step


def test_a_pipeline_without_graph_structure_is_a_chain() -> None:
    chain = Pipeline("chain")
    chain.step()(lambda v: v)
    assert chain.spec().graph is None
    assert parallel.spec().graph is not None


# --- readiness rules, skips, error branches --------------------------------------------------

rules = Pipeline("rules")


@rules.step(retry=ONCE)
def work(value: dict[str, Any]) -> dict[str, Any]:
    if value.get("fail"):
        raise NonRetryableError("work failed")
    return {"worked": True}


@rules.step(needs=["work"])
def after_work(value: dict[str, Any]) -> dict[str, Any]:
    return value


@rules.step(needs=["after_work"])
def after_after(value: dict[str, Any]) -> dict[str, Any]:
    return value


@rules.step(needs=["work"], rule="one_failed")
def on_failure(value: Any) -> str:
    return "alerted"


@rules.step(needs=["work"], rule="all_done")
def always_report(value: Any) -> str:
    return "reported"


@pytest.fixture
def env_rules() -> Iterator[LocalEnvironment]:
    with LocalEnvironment(Application([rules])) as env:
        yield env


def test_a_failure_skips_its_successors_two_levels_and_runs_the_error_branches(
    env_rules: LocalEnvironment,
) -> None:
    run_id = env_rules.submit("rules", {"fail": True})
    result = env_rules.wait(run_id)
    assert result.status == "failed" and "work failed" in (result.error or "")
    facts = env_rules.history(run_id)
    assert _skips(rules, facts) == {
        "after_work": "readiness_unsatisfied",
        "after_after": "readiness_unsatisfied",
    }
    assert sorted(_names(rules, facts, StepCompleted)) == ["always_report", "on_failure"]


def test_on_success_the_error_branch_is_skipped_and_all_done_runs(
    env_rules: LocalEnvironment,
) -> None:
    run_id = env_rules.submit("rules", {})
    assert env_rules.wait(run_id).status == "succeeded"
    facts = env_rules.history(run_id)
    assert _skips(rules, facts) == {"on_failure": "readiness_unsatisfied"}
    assert "always_report" in _names(rules, facts, StepCompleted)


# --- routes ----------------------------------------------------------------------------------

routes = Pipeline("routes")


@routes.step(routes=["refund", "reship"])
def triage(claim: dict[str, Any]) -> Any:
    return claim["choose"]


@routes.step(needs=["triage"])
def refund(claim: dict[str, Any]) -> dict[str, Any]:
    return {"refunded": claim["amount"]}


@routes.step(needs=["triage"])
def reship(claim: dict[str, Any]) -> dict[str, Any]:
    return {"reshipped": claim["amount"]}


@routes.step(needs=["refund", "reship"], rule="none_failed")
def close(outputs: dict[str, Any]) -> dict[str, Any]:
    return outputs


@routes.step(needs=["refund", "reship"])
def strict_join(outputs: dict[str, Any]) -> dict[str, Any]:
    return outputs


@pytest.fixture
def env_routes() -> Iterator[LocalEnvironment]:
    with LocalEnvironment(Application([routes])) as env:
        yield env


def test_a_switch_runs_its_chosen_route_and_skips_the_other_durably(
    env_routes: LocalEnvironment,
) -> None:
    run_id = env_routes.submit("routes", {"choose": "refund", "amount": 5})
    result = env_routes.wait(run_id)
    assert result.status == "succeeded", result
    facts = env_routes.history(run_id)
    decided = [f for f in facts if isinstance(f, RouteDecided)]
    assert [f.routes for f in decided] == [("refund",)]
    assert "reship" not in _names(routes, facts, NodeReady)  # never dispatched
    assert _skips(routes, facts) == {
        "reship": "predicate_false",
        "strict_join": "readiness_unsatisfied",  # all_success: a skipped route skips it
    }
    # none_failed: the join runs after what was selected; the route got the switch's input
    assert result.output == {"refund": {"refunded": 5}, "reship": None}


def test_a_switch_may_choose_several_routes(env_routes: LocalEnvironment) -> None:
    run_id = env_routes.submit("routes", {"choose": ["refund", "reship"], "amount": 1})
    result = env_routes.wait(run_id)
    assert result.status == "succeeded"
    assert result.output == {"refund": {"refunded": 1}, "reship": {"reshipped": 1}}
    assert _skips(routes, env_routes.history(run_id)) == {}


def test_a_switch_choosing_no_declared_route_fails_without_retry(
    env_routes: LocalEnvironment,
) -> None:
    run_id = env_routes.submit("routes", {"choose": "lose", "amount": 1})
    result = env_routes.wait(run_id)
    assert result.status == "failed"
    assert "chose ['lose']" in (result.error or "")
    facts = env_routes.history(run_id)
    settled = [f for f in facts if isinstance(f, NodeSettled) and f.step == 0]
    assert [(f.status, f.error_type, f.attempts) for f in settled] == [
        ("failed", "InvalidRoute", 1)
    ]
    assert _skips(routes, facts) == {
        "refund": "readiness_unsatisfied",  # a failed switch: its routes follow their rule
        "reship": "readiness_unsatisfied",
        "strict_join": "readiness_unsatisfied",
    }  # close (none_failed) runs: skipped needs are no failures


# --- catch and finally -----------------------------------------------------------------------

handled = Pipeline("handled")
_cleanups: list[Any] = []


@handled.step()
def fetch(value: dict[str, Any]) -> dict[str, Any]:
    return value


@handled.step(needs=["fetch"], catch="fallback", retry=RetryPolicy(max_attempts=2))
def price(value: dict[str, Any]) -> dict[str, Any]:
    if value.get("broken"):
        raise ValueError(f"no price for {value['sku']}")
    return {"price": 10}


@handled.step()
def fallback(error: dict[str, Any]) -> dict[str, Any]:
    return {"price": 0, "because": error}


@handled.step(needs=["price"])
def quote(priced: dict[str, Any]) -> dict[str, Any]:
    return {"quote": priced}


@handled.finally_step(needs=["quote"])
def cleanup(value: Any) -> str:
    _cleanups.append(value)
    return "cleaned"


@pytest.fixture
def env_handled() -> Iterator[LocalEnvironment]:
    _cleanups.clear()
    with LocalEnvironment(Application([handled])) as env:
        yield env


def test_a_caught_failure_hands_its_typed_error_to_the_handler_whose_output_goes_on(
    env_handled: LocalEnvironment,
) -> None:
    run_id = env_handled.submit("handled", {"sku": "a-1", "broken": True})
    env_handled.wait_fact(run_id, RetryScheduled)  # price failed once
    env_handled.advance(60)  # the retry's backoff
    result = env_handled.wait(run_id)
    assert result.status == "succeeded", result
    error = {"type": "ValueError", "message": "no price for a-1", "attempt": 2, "step": "price"}
    assert result.output == {"quote": {"price": 0, "because": error}}
    facts = env_handled.history(run_id)
    caught = [f for f in facts if isinstance(f, CatchDecided)]
    assert [(f.step, f.handler) for f in caught] == [(1, 2)]
    assert _names(handled, facts, NodeReady)[-1] == "cleanup"  # finally: after the rest
    assert _cleanups == [result.output]


def test_a_handler_that_is_not_needed_is_skipped_and_finally_still_runs(
    env_handled: LocalEnvironment,
) -> None:
    run_id = env_handled.submit("handled", {"sku": "a-2"})
    result = env_handled.wait(run_id)
    assert result.status == "succeeded"
    assert result.output == {"quote": {"price": 10}}  # the result: the last step, not finally
    assert _skips(handled, env_handled.history(run_id)) == {"fallback": "readiness_unsatisfied"}
    assert _cleanups == [{"quote": {"price": 10}}]


finally_after = Pipeline("finally_after")
_gate = threading.Event()
_finals: list[str] = []


@finally_after.step(timeout_s=600)
def slow_step(value: Any) -> Any:
    _gate.wait(20)
    return value


@finally_after.step(needs=["slow_step"])
def never_reached(value: Any) -> Any:
    return value


@finally_after.finally_step()
def release(value: Any) -> str:
    _finals.append("released")
    return "released"


@pytest.fixture
def env_finally() -> Iterator[LocalEnvironment]:
    _gate.clear()
    _finals.clear()
    with LocalEnvironment(Application([finally_after])) as env:
        yield env
    _gate.set()


def test_finally_runs_after_a_cancel_once_the_running_step_settled(
    env_finally: LocalEnvironment,
) -> None:
    run_id = env_finally.submit("finally_after", {"x": 1})
    env_finally.wait_fact(run_id, SegmentAttemptStarted)
    env_finally.client.cancel(run_id, "changed my mind")
    _gate.set()  # the running step settles; then the finally step runs
    result = env_finally.wait(run_id)
    assert result.status == "cancelled"
    facts = env_finally.history(run_id)
    assert _names(finally_after, facts, StepCompleted) == ["slow_step", "release"]
    assert "never_reached" not in _names(finally_after, facts, NodeReady)
    assert _finals == ["released"]
    stopped = [f for f in facts if isinstance(f, RunStopped)]
    assert [f.execution for f in stopped] == ["Cancelled"]


def test_finally_runs_after_the_run_deadline(env_finally: LocalEnvironment) -> None:
    run_id = env_finally.submit("finally_after", {"x": 2}, deadline_s=30)
    env_finally.wait_fact(run_id, SegmentAttemptStarted)
    env_finally.advance(31)  # the deadline passes while slow_step runs
    _gate.set()
    result = env_finally.wait(run_id)
    assert result.status == "timed_out"
    assert _finals == ["released"]


# --- compensation across branches ------------------------------------------------------------

unwind = Pipeline("unwind")
_undone: list[str] = []


@unwind.step()
def open_order(value: Any) -> Any:
    return value


@unwind.step(needs=["open_order"])
def book_a(value: Any) -> str:
    return "a"


@unwind.step(needs=["open_order"])
def book_b(value: Any) -> str:
    return "b"


@unwind.step(needs=["book_a", "book_b"], retry=ONCE)
def settle(value: Any) -> Any:
    raise NonRetryableError("settlement refused")


def _undoer(name: str) -> Any:
    def undo(value: Any) -> None:
        _undone.append(name)

    return undo


for _name in ("open_order", "book_a", "book_b"):
    unwind.compensate(_name)(_undoer(_name))


def test_compensation_undoes_every_branch_in_reverse_order_of_completion() -> None:
    _undone.clear()
    with LocalEnvironment(Application([unwind])) as env:
        run_id = env.submit("unwind", {})
        result = env.wait(run_id)
        assert result.status == "failed"
        facts = env.history(run_id)
    completed = _names(unwind, facts, StepCompleted)
    assert sorted(completed) == ["book_a", "book_b", "open_order"]
    ready = [f for f in facts if isinstance(f, NodeReady)]
    assert ready[1].cause_id == ready[2].cause_id  # compensated steps still run in parallel
    steps = [s.spec.name for s in unwind.steps]
    compensated = [steps[f.step] for f in facts if isinstance(f, CompensationStepCompleted)]
    assert compensated == list(reversed(completed)) == _undone


def test_a_compensator_keeps_its_steps_place_in_the_graph() -> None:
    """Registering a compensator keeps the step's needs and guard: the sibling declared
    after it still needs only the first step and gets that step's output."""
    kept = Pipeline("kept")
    kept.step("first")(lambda value: {"n": value["n"]})
    kept.step("left", needs=["first"], when=lambda value: value["n"] > 0)(lambda v: "left")
    kept.step("right", needs=["first"])(lambda value: value["n"] * 2)
    kept.step("join", needs=["left", "right"])(lambda outputs: outputs)
    kept.compensate("left")(lambda output: None)
    kept.compensate("right")(lambda output: None)
    assert [s.node.needs if s.node else None for s in kept.steps[1:3]] == [("first",)] * 2
    with LocalEnvironment(Application([kept])) as env:
        result = env.wait(env.submit("kept", {"n": 3}))
        guarded = env.submit("kept", {"n": 0})
        env.wait(guarded)
        facts = env.history(guarded)
    assert result.status == "succeeded"
    assert result.output == {"left": "left", "right": 6}
    assert _names(kept, facts, NodeSkipped) == ["left", "join"]  # the guard held


# --- checked when defined --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("declare", "message"),
    [
        (lambda p: p.step("second", needs=["ghost"])(lambda v: v), "'ghost'"),
        (lambda p: p.step("second", catch="nobody")(lambda v: v), "'nobody'"),
        (lambda p: p.step("second", routes=["nowhere"])(lambda v: v), "'nowhere'"),
    ],
)
def test_a_graph_that_cannot_run_is_refused_when_the_application_is_built(
    declare: Any, message: str
) -> None:
    pipeline = Pipeline("broken")
    pipeline.step("first")(lambda v: v)
    declare(pipeline)
    with pytest.raises(ConfigurationError, match=message) as refused:
        Application([pipeline])
    assert "pipeline 'broken'" in str(refused.value)


def test_a_cycle_is_refused_naming_its_steps() -> None:
    pipeline = Pipeline("cyclic")

    @pipeline.step(needs=["b"])
    def a(v: Any) -> Any:
        return v

    @pipeline.step(needs=["a"])
    def b(v: Any) -> Any:
        return v

    with pytest.raises(ConfigurationError, match="cycle"):
        Application([pipeline])


effects = Pipeline("effects")
_charging = threading.Event()
_charge_gate = threading.Event()


@effects.step()
def place(order: dict[str, Any]) -> dict[str, Any]:
    return order


@effects.step(needs=["place"], effectful=True, timeout_s=60)
def charge_card(order: dict[str, Any]) -> dict[str, Any]:
    _charging.set()
    _charge_gate.wait(20)  # the worker hangs: its outcome becomes Unknown
    return {"charged": order["total"]}


@effects.step(needs=["place"])
def email(order: dict[str, Any]) -> str:
    return "sent"


@effects.step(needs=["charge_card", "email"])
def receipt(outputs: dict[str, Any]) -> dict[str, Any]:
    return outputs


def test_an_unknown_graph_step_waits_for_its_operator_and_the_graph_goes_on() -> None:
    _charging.clear()
    _charge_gate.clear()
    with LocalEnvironment(Application([effects])) as env:
        run_id = env.submit("effects", {"total": 9})
        assert _charging.wait(10)
        env.advance(61)  # charge_card's timeout: an effectful step is never retried blindly
        unknown = env.wait_fact(run_id, AttemptOutcomeUnknown)
        state = env.client.status(run_id)
        assert state is not None and is_unknown(state)  # listed for its operator
        shown = status_dict(state)["graph"]
        lane = shown["lanes"][str(unknown.segment)]
        assert lane["phase"] == "unknown" and lane["unknown_attempt"]["step"] == 1
        reply = env.client.resolve(
            run_id,
            segment=unknown.segment,
            attempt=unknown.attempt,
            generation=unknown.generation,
            idempotency_key="charge-checked-by-hand",
            action="succeed",
            output={"charged": 9, "by": "operator"},
        )
        assert reply is not None and reply.refusal is None, reply
        _charge_gate.set()  # the hung attempt's late result is stale now
        result = env.wait(run_id)
    assert result.status == "succeeded", result
    assert result.output == {"charge_card": {"by": "operator", "charged": 9}, "email": "sent"}


# --- fan-out ---------------------------------------------------------------------------------

fan = Pipeline("fan")
_tries: dict[int, int] = {}


@fan.step()
def make_items(spec: dict[str, Any]) -> Any:
    return spec["items"] if "items" in spec else list(range(spec["n"]))


@fan.fan_out(
    needs=["make_items"],
    max_in_flight=5,
    tolerate_percent=10,
    retry=RetryPolicy(max_attempts=2, initial_backoff_ms=0, max_backoff_ms=0),
)
def square(item: int) -> int:
    _tries[item] = _tries.get(item, 0) + 1
    if item % 10 == 3:
        raise ValueError(f"bad item {item}")
    if item % 10 == 5 and _tries[item] == 1:
        raise RuntimeError("flaky once")  # retried, per item
    return item * item


@fan.step(needs=["square"])
def summarize(output: dict[str, Any]) -> dict[str, Any]:
    return output


@pytest.fixture
def env_fan() -> Iterator[LocalEnvironment]:
    _tries.clear()
    with LocalEnvironment(Application([fan])) as env:
        yield env


def _most_open(facts: list[FactHeader]) -> int:
    """The most items open at once, from the facts: started, not yet settled."""
    open_items, most = 0, 0
    for fact in facts:
        if isinstance(fact, NodeReady) and fact.item is not None:
            open_items += 1
            most = max(most, open_items)
        elif isinstance(fact, FanOutItemSettled):
            open_items -= 1
    return most


def test_a_fan_out_of_200_items_never_has_more_than_5_open_and_tolerates_20_failures(
    env_fan: LocalEnvironment,
) -> None:
    run_id = env_fan.submit("fan", {"n": 200})
    result = env_fan.wait(run_id, timeout_s=60)
    assert result.status == "succeeded", result
    facts = env_fan.history(run_id)
    assert _most_open(facts) == 5
    settled = [f for f in facts if isinstance(f, FanOutItemSettled)]
    assert sorted(f.item for f in settled) == list(range(200))  # each item once
    output = result.output
    assert output["items"] == [None if i % 10 == 3 else i * i for i in range(200)]
    assert [f["item"] for f in output["failed"]] == list(range(3, 200, 10))
    assert output["failed"][0] == {"item": 3, "type": "ValueError", "message": "bad item 3"}
    assert all(_tries[i] == 2 for i in range(5, 200, 10))  # a retry per flaky item


def test_a_fan_out_of_200_items_fails_at_21_failures(env_fan: LocalEnvironment) -> None:
    items = [*range(199), 1003]  # 1003 fails too: 21 of 200
    run_id = env_fan.submit("fan", {"items": items})
    result = env_fan.wait(run_id, timeout_s=60)
    assert result.status == "failed"
    assert (result.error or "").startswith("21 of 200 items failed, more than tolerated")
    assert result.error_type == "FanOutFailed"
    facts = env_fan.history(run_id)
    started = [f.item for f in facts if isinstance(f, NodeReady) and f.item is not None]
    assert started == list(range(200))
    assert "summarize" in _skips(fan, facts)


def test_a_fan_out_of_no_items_succeeds_at_once_and_one_of_no_list_fails(
    env_fan: LocalEnvironment,
) -> None:
    empty = env_fan.wait(env_fan.submit("fan", {"items": []}))
    assert empty.status == "succeeded" and empty.output == {"failed": [], "items": []}
    wrong = env_fan.wait(env_fan.submit("fan", {"items": {"not": "a list"}}))
    assert wrong.status == "failed" and "needs a list" in (wrong.error or "")


# --- predicates ------------------------------------------------------------------------------

guarded = Pipeline("guarded")
_notified: list[Any] = []


@guarded.step()
def receive(order: dict[str, Any]) -> dict[str, Any]:
    return order


@guarded.step(needs=["receive"], when=lambda order: order["total"] > 100)
def notify_manager(order: dict[str, Any]) -> str:
    _notified.append(order)
    return "notified"


@guarded.step(needs=["notify_manager"])
def after_notify(value: Any) -> Any:
    return value


@guarded.step(needs=["receive", "notify_manager"], rule="none_failed")
def finish(outputs: dict[str, Any]) -> dict[str, Any]:
    return outputs


def test_a_false_predicate_skips_its_step_durably_and_a_true_one_runs_it() -> None:
    _notified.clear()
    with LocalEnvironment(Application([guarded])) as env:
        small = env.submit("guarded", {"total": 5})
        small_result = env.wait(small)
        big = env.submit("guarded", {"total": 500})
        big_result = env.wait(big)
        small_facts, big_facts = env.history(small), env.history(big)
    assert small_result.status == "succeeded"
    assert small_result.output == {"notify_manager": None, "receive": {"total": 5}}
    assert _skips(guarded, small_facts) == {
        "notify_manager": "predicate_false",
        "after_notify": "readiness_unsatisfied",
    }
    assert "notify_manager" not in _names(guarded, small_facts, StepCompleted)
    assert big_result.output == {"notify_manager": "notified", "receive": {"total": 500}}
    assert _skips(guarded, big_facts) == {}
    assert _notified == [{"total": 500}]


# --- awaits and sleeps in a graph ------------------------------------------------------------

waiting = Pipeline("waiting")


@waiting.step()
def request(order: dict[str, Any]) -> dict[str, Any]:
    return order


@waiting.await_step(needs=["request"], target="payments", timeout_s=600)
def pay(order: dict[str, Any]) -> dict[str, Any]:
    return {"amount": order["total"]}


@waiting.await_step(needs=["request"], target="warehouse", timeout_s=60, on_timeout="continue")
def pack(order: dict[str, Any]) -> dict[str, Any]:
    return {"items": order["items"]}


waiting.sleep(30, name="cool_off", needs=["request"])


@waiting.step(needs=["pay", "pack", "cool_off"], rule="all_done")
def done(outputs: dict[str, Any]) -> dict[str, Any]:
    return outputs


def test_two_awaits_and_a_sleep_wait_side_by_side_in_one_run() -> None:
    with LocalEnvironment(Application([waiting])) as env:
        run_id = env.submit("waiting", {"total": 7, "items": 3})
        env.wait_fact(run_id, BoundaryDispatchCompleted, count=2)  # each in its own lane
        assert sorted(r.target for r in env.pending(run_id)) == ["payments", "warehouse"]
        payments = next(r for r in env.pending(run_id) if r.target == "payments")
        env.complete(payments, {"paid": 7})
        env.advance(61)  # the warehouse's timeout passes (continue), and the sleep ends
        result = env.wait(run_id)
    assert result.status == "succeeded", result
    assert result.output == {
        "cool_off": {"items": 3, "total": 7},  # a sleep passes its input on
        "pack": {"timed_out": True},  # on_timeout="continue"
        "pay": {"paid": 7},
    }


def test_a_cancel_reaches_every_waiting_branch_of_a_graph_run() -> None:
    with LocalEnvironment(Application([waiting])) as env:
        run_id = env.submit("waiting", {"total": 1, "items": 1})
        env.wait_fact(run_id, BoundaryDispatchCompleted, count=2)
        env.client.cancel(run_id, "no longer wanted")
        result = env.wait(run_id)
        assert result.status == "cancelled"
        assert env.pending(run_id) == []
        facts = env.history(run_id)
    stopped = [f for f in facts if isinstance(f, NodeSettled) and f.status == "stopped"]
    assert sorted(_names(waiting, stopped, NodeSettled)) == ["cool_off", "pack", "pay"]


# --- a checkpoint handoff in a graph --------------------------------------------------------

handed = Pipeline("handed")
_handed_gate = threading.Event()


@handed.step()
def prepare(value: dict[str, Any]) -> dict[str, Any]:
    return value


handed.await_checkpoint("go", timeout_s=600, needs=["prepare"])


@handed.step(needs=["prepare"], timeout_s=600)
def crunch(value: dict[str, Any]) -> int:
    _handed_gate.wait(20)  # still running when the handoff arrives
    return int(value["n"]) * 2


@handed.step(needs=["await_go", "crunch"])
def combine(outputs: dict[str, Any]) -> dict[str, Any]:
    return outputs


def test_a_checkpoint_handoff_answers_a_graph_await_while_another_branch_runs() -> None:
    """``await_go`` waits in its own lane for the checkpoint ``go``, which another
    pipeline's run hands off to this run (``run:<id>``) while ``crunch`` runs beside it;
    the join gets the handoff's payload and crunch's output by name."""
    _handed_gate.clear()
    key = f"graph-handoff-{uuid.uuid4()}"
    upstream = Pipeline("upstream", checkpoint=CheckpointSpec("go", f"run:{derive_run_id(key)}"))
    upstream.step("ready")(lambda value: {"ready": value})
    try:
        with LocalEnvironment(Application([handed, upstream])) as env:
            run_id = env.submit("handed", {"n": 4}, idempotency_key=key)
            assert run_id == derive_run_id(key)
            suspended = env.wait_fact(run_id, SegmentSuspended)
            assert (suspended.kind, handed.steps[suspended.step].spec.name) == (
                "checkpoint",
                "await_go",
            )
            assert env.wait(env.submit("upstream", "up")).status == "succeeded"
            admitted = env.wait_fact(run_id, BoundaryCompletionAdmitted)
            assert admitted.source == "checkpoint"
            facts = env.history(run_id)
            assert "crunch" not in _names(handed, facts, StepCompleted)  # still running
            _handed_gate.set()
            result = env.wait(run_id)
            facts = env.history(run_id)
    finally:
        _handed_gate.set()
    assert result.status == "succeeded", result
    assert result.output == {"await_go": {"ready": "up"}, "crunch": 8}
    lanes = {f.segment for f in facts if isinstance(f, SegmentAttemptStarted)}
    assert suspended.segment in lanes and len(lanes) == 4  # a lane per step
    assert len([f for f in facts if isinstance(f, BoundaryCompletionAdmitted)]) == 1


# --- redrive ---------------------------------------------------------------------------------

redrivable = Pipeline("redrivable")
_broken = {"stock": True}
_runs_of: dict[str, int] = {}


def _counted(name: str, value: Any) -> Any:
    _runs_of[name] = _runs_of.get(name, 0) + 1
    return value


@redrivable.step()
def start_order(order: Any) -> Any:
    return _counted("start_order", order)


@redrivable.step(needs=["start_order"])
def bill(order: Any) -> Any:
    return _counted("bill", {"billed": True})


@redrivable.step(needs=["start_order"], retry=ONCE)
def stock(order: Any) -> Any:
    if _broken["stock"]:
        raise NonRetryableError("warehouse offline")
    return _counted("stock", {"stocked": True})


@redrivable.step(needs=["bill", "stock"])
def ship_it(outputs: Any) -> Any:
    return _counted("ship_it", outputs)


def test_a_failed_graph_run_is_redriven_from_its_failed_branch_only() -> None:
    _broken["stock"] = True
    _runs_of.clear()
    with LocalEnvironment(Application([redrivable])) as env:
        run_id = env.submit("redrivable", {})
        failed = env.wait(run_id)
        assert failed.status == "failed" and failed.error == "warehouse offline"
        _broken["stock"] = False
        reply = env.client.redrive(run_id, operator="ops", reason="warehouse back")
        assert reply is not None and reply.refusal is None, reply
        result = env.wait(run_id)
    assert result.status == "succeeded", result
    assert result.output == {"bill": {"billed": True}, "stock": {"stocked": True}}
    # the succeeded branch kept its output and did not run again
    assert _runs_of == {"start_order": 1, "bill": 1, "stock": 1, "ship_it": 1}


# --- itemized awaits under a limit ------------------------------------------------------------


def test_an_itemized_await_sends_at_most_3_at_once_and_tolerates_one_failure() -> None:
    with LocalEnvironment(Application([batched])) as env:
        run_id = env.submit("batched", {"parcels": 8})
        env.wait_fact(run_id, BoundaryDispatchCompleted)
        assert [r.item_index for r in env.pending(run_id)] == [0, 1, 2]
        most = answer_all(env, run_id, failing={4})
        result = env.wait(run_id)
        failing = env.submit("batched", {"parcels": 8})
        answer_all(env, failing, failing={2, 5})
        failed = env.wait(failing)
    assert most == 3
    assert result.status == "succeeded", result
    labels = [None if i == 4 else {"label": i} for i in range(8)]
    assert result.output == {
        "failed": [{"error": "printer jammed on 4", "item": 4}],
        "items": labels,
    }
    assert failed.status == "failed"
    assert (failed.error or "").startswith("2 of 8 items failed, more than tolerated")
