"""The graph planner: what becomes ready, what is skipped and why, and the run's outcome."""

from __future__ import annotations

from processor.model.graph import Graph, Node, build_graph
from processor.model.graph_plan import (
    CAUGHT,
    FAILED,
    RUNNING,
    SUCCEEDED,
    NodeState,
    Plan,
    plan,
    skipped,
)


def chain(*names: str) -> Graph:
    return build_graph([Node(n) for n in names])


def test_a_chain_starts_with_its_first_step_and_goes_one_by_one() -> None:
    graph = chain("a", "b", "c")
    assert plan(graph, {}) == Plan(ready=("a",))
    assert plan(graph, {"a": RUNNING}) == Plan()
    assert plan(graph, {"a": SUCCEEDED}) == Plan(ready=("b",))
    done = plan(graph, {"a": SUCCEEDED, "b": SUCCEEDED, "c": SUCCEEDED})
    assert done == Plan(work_outcome="succeeded", outcome="succeeded")


def test_independent_steps_are_ready_together_in_step_order() -> None:
    graph = build_graph(
        [
            Node("order"),
            Node("reserve", needs=("order",)),
            Node("charge", needs=("order",)),
            Node("ship", needs=("charge", "reserve")),
        ]
    )
    assert plan(graph, {"order": SUCCEEDED}).ready == ("reserve", "charge")
    assert plan(graph, {"order": SUCCEEDED, "reserve": SUCCEEDED, "charge": RUNNING}) == Plan()
    states = {"order": SUCCEEDED, "reserve": SUCCEEDED, "charge": SUCCEEDED}
    assert plan(graph, states).ready == ("ship",)


def test_one_failed_is_an_error_branch_and_the_run_still_fails() -> None:
    graph = build_graph(
        [Node("pay"), Node("ship"), Node("alert", needs=("pay",), rule="one_failed")]
    )
    failed = plan(graph, {"pay": FAILED})
    assert failed.ready == ("alert",)
    assert failed.skipped == (("ship", "readiness_unsatisfied"),)
    assert failed.outcome is None
    after = plan(
        graph, {"pay": FAILED, "ship": skipped("readiness_unsatisfied"), "alert": SUCCEEDED}
    )
    assert after.outcome == "failed"
    fine = plan(graph, {"pay": SUCCEEDED, "ship": SUCCEEDED})
    assert fine.skipped == (("alert", "readiness_unsatisfied"),)
    assert fine.outcome == "succeeded"


def test_all_done_runs_after_a_failure() -> None:
    graph = build_graph([Node("a"), Node("b"), Node("tidy", needs=("a", "b"), rule="all_done")])
    first = plan(graph, {"a": FAILED})
    assert first.skipped == (("b", "readiness_unsatisfied"),)
    assert first.ready == ("tidy",)
    states = {"a": FAILED, "b": skipped("readiness_unsatisfied"), "tidy": SUCCEEDED}
    assert plan(graph, states).outcome == "failed"


def test_a_skip_propagates_through_two_levels_in_one_call() -> None:
    graph = build_graph(
        [
            Node("a"),
            Node("b"),
            Node("c"),
            Node("side", needs=("a",), rule="none_failed"),
            Node("last", needs=("c", "side"), rule="all_done"),
        ]
    )
    result = plan(graph, {"a": FAILED})
    assert result.skipped == (
        ("b", "readiness_unsatisfied"),
        ("c", "readiness_unsatisfied"),
        ("side", "readiness_unsatisfied"),
    )
    assert result.ready == ("last",)


def test_a_skip_propagates_against_declaration_order() -> None:
    graph = build_graph([Node("c", needs=("b",)), Node("b", needs=("a",)), Node("a", needs=())])
    assert plan(graph, {"a": FAILED}).skipped == (
        ("b", "readiness_unsatisfied"),
        ("c", "readiness_unsatisfied"),
    )


def test_a_caught_failure_counts_as_a_success_for_the_join() -> None:
    graph = build_graph(
        [
            Node("start"),
            Node("charge", needs=("start",), catch="refund"),
            Node("refund"),
            Node("reserve", needs=("start",)),
            Node("join", needs=("charge", "reserve")),
        ]
    )
    states: dict[str, NodeState] = {"start": SUCCEEDED, "charge": FAILED, "reserve": SUCCEEDED}
    decided = plan(graph, states)
    assert decided.caught == (("charge", "refund"),)
    assert decided.ready == ("refund",)  # the join waits for the handler's output
    states |= {"charge": CAUGHT, "refund": SUCCEEDED}
    assert plan(graph, states).ready == ("join",)
    states |= {"join": SUCCEEDED}
    assert plan(graph, states).outcome == "succeeded"


def test_a_failed_handler_fails_the_handled_step_for_its_successors() -> None:
    graph = build_graph([Node("a", catch="h"), Node("h"), Node("b")])
    result = plan(graph, {"a": CAUGHT, "h": FAILED})
    assert result.skipped == (("b", "readiness_unsatisfied"),)
    assert result.outcome == "failed"


def test_a_handler_of_a_handler_stands_in_for_both() -> None:
    graph = build_graph([Node("a", catch="h1"), Node("h1", catch="h2"), Node("h2"), Node("b")])
    assert plan(graph, {"a": CAUGHT, "h1": FAILED}).caught == (("h1", "h2"),)
    assert plan(graph, {"a": CAUGHT, "h1": CAUGHT, "h2": RUNNING}) == Plan()
    assert plan(graph, {"a": CAUGHT, "h1": CAUGHT, "h2": SUCCEEDED}).ready == ("b",)


def test_a_handler_is_skipped_when_its_step_did_not_fail() -> None:
    graph = build_graph([Node("a", catch="h"), Node("h"), Node("b")])
    result = plan(graph, {"a": SUCCEEDED})
    assert result.skipped == (("h", "readiness_unsatisfied"),)
    assert result.ready == ("b",)


def test_finally_runs_after_a_failure_and_keeps_the_outcome() -> None:
    graph = build_graph([Node("a"), Node("b"), Node("cleanup", is_finally=True)])
    assert plan(graph, {}).ready == ("a",)  # not the finally step
    failed = plan(graph, {"a": FAILED})
    assert failed.ready == ("cleanup",)
    assert failed.work_outcome == "failed"
    assert failed.outcome is None
    states = {"a": FAILED, "b": skipped("readiness_unsatisfied"), "cleanup": SUCCEEDED}
    assert plan(graph, states).outcome == "failed"


def test_a_failing_finally_step_fails_a_successful_run() -> None:
    graph = build_graph([Node("a"), Node("cleanup", is_finally=True)])
    assert plan(graph, {"a": SUCCEEDED}) == Plan(ready=("cleanup",), work_outcome="succeeded")
    result = plan(graph, {"a": SUCCEEDED, "cleanup": FAILED})
    assert result == Plan(work_outcome="succeeded", outcome="failed")


SWITCH = [
    Node("s", routes=("x", "y")),
    Node("x", needs=("s",)),
    Node("y", needs=("s",)),
    Node("join", needs=("x", "y"), rule="none_failed"),
    Node("strict", needs=("x", "y")),
]


def test_unselected_routes_are_skipped_and_the_joins_follow_their_rules() -> None:
    graph = build_graph(SWITCH)
    routed = plan(graph, {"s": SUCCEEDED}, routes={"s": ["x"]})
    assert routed.ready == ("x",)
    assert routed.skipped == (("y", "predicate_false"), ("strict", "readiness_unsatisfied"))
    states = {"s": SUCCEEDED, "x": SUCCEEDED, "y": skipped("predicate_false")}
    after = plan(graph, states, routes={"s": ["x"]})
    assert after.ready == ("join",)


def test_a_route_target_waits_for_its_switch_decision() -> None:
    graph = build_graph(SWITCH)
    assert plan(graph, {"s": SUCCEEDED}) == Plan()
    both = plan(graph, {"s": SUCCEEDED}, routes={"s": ["x", "y"]})
    assert both.ready == ("x", "y")


def test_a_failed_switch_skips_its_routes_by_the_rules() -> None:
    graph = build_graph(SWITCH)
    result = plan(graph, {"s": FAILED})
    assert [name for name, _ in result.skipped] == ["x", "y", "strict"]
    # Seed 004: a skip is not a failure, so none_failed runs after skipped needs.
    assert result.ready == ("join",)
    states = {"s": FAILED, "join": SUCCEEDED} | {n: skipped("readiness_unsatisfied") for n in "xy"}
    assert plan(graph, states | {"strict": skipped("readiness_unsatisfied")}).outcome == "failed"


def test_a_false_predicate_skips_the_step_and_a_true_one_runs_it() -> None:
    graph = build_graph([Node("a"), Node("b", when=True), Node("c", rule="none_failed")])
    assert plan(graph, {"a": SUCCEEDED}).ready == ("b",)  # its worker evaluates the predicate
    decided = plan(graph, {"a": SUCCEEDED, "b": RUNNING}, predicates={"b": False})
    assert decided == Plan(ready=("c",), skipped=(("b", "predicate_false"),))
    assert plan(graph, {"a": SUCCEEDED}, predicates={"b": False}).skipped == (
        ("b", "predicate_false"),
    )
    assert plan(graph, {"a": SUCCEEDED, "b": RUNNING}, predicates={"b": True}) == Plan()


def test_always_runs_at_once_and_an_empty_one_failed_is_skipped() -> None:
    graph = build_graph(
        [
            Node("a"),
            Node("watch", needs=("a",), rule="always"),
            Node("oops", needs=(), rule="one_failed"),
        ]
    )
    result = plan(graph, {})
    assert result.ready == ("a", "watch")
    assert result.skipped == (("oops", "readiness_unsatisfied"),)


def test_everything_skipped_but_nothing_failed_is_a_success() -> None:
    graph = build_graph([Node("a", when=True), Node("b")])
    result = plan(graph, {"a": RUNNING}, predicates={"a": False})
    assert result.skipped == (("a", "predicate_false"), ("b", "readiness_unsatisfied"))
    assert result.outcome == "succeeded"


def test_a_failure_being_caught_is_not_a_failure_even_for_an_earlier_declared_step() -> None:
    graph = build_graph(
        [Node("alert", needs=("a",), rule="one_failed"), Node("a", needs=(), catch="h"), Node("h")]
    )
    result = plan(graph, {"a": FAILED})
    assert result.caught == (("a", "h"),)
    assert result.ready == ("h",)
    assert plan(graph, {"a": CAUGHT, "h": SUCCEEDED}).skipped == (
        ("alert", "readiness_unsatisfied"),
    )
