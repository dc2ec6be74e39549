"""A graph's definition: default needs, and a clear refusal naming the step."""

from __future__ import annotations

import pytest

from processor.errors import ConfigurationError
from processor.model.graph import FanOutLimits, Node, Tolerance, build_graph
from processor.worker.pipeline import Pipeline


def test_steps_without_needs_are_a_chain() -> None:
    graph = build_graph([Node("a"), Node("b"), Node("c")])
    assert [graph.needs(n) for n in ("a", "b", "c")] == [(), ("a",), ("b",)]


def test_explicit_needs_are_kept_and_order_is_declaration_order() -> None:
    graph = build_graph([Node("a"), Node("b", needs=()), Node("c", needs=("a", "b"))])
    assert [n.name for n in graph.nodes] == ["a", "b", "c"]
    assert graph.needs("b") == ()
    assert graph.needs("c") == ("a", "b")


def test_handlers_and_finally_steps_need_nothing_and_are_not_a_default_need() -> None:
    graph = build_graph(
        [Node("a", catch="h"), Node("h"), Node("b"), Node("f", is_finally=True), Node("c")]
    )
    assert graph.needs("h") == ()
    assert graph.needs("f") == ()
    assert graph.needs("b") == ("a",)
    assert graph.needs("c") == ("b",)
    assert graph.handles == {"h": "a"}


def test_route_targets_are_indexed_by_their_switches() -> None:
    graph = build_graph(
        [Node("s", routes=("x", "y")), Node("x", needs=("s",)), Node("y", needs=("s",))]
    )
    assert dict(graph.switches_of) == {"x": ("s",), "y": ("s",)}


REFUSED: list[tuple[str, list[Node], str]] = [
    ("duplicate", [Node("a"), Node("a")], "two steps are named 'a'"),
    ("unknown need", [Node("a"), Node("b", needs=("nope",))], "step 'b' needs 'nope'"),
    ("need twice", [Node("a"), Node("b", needs=("a", "a"))], "step 'b' names a need twice"),
    (
        "cycle",
        [Node("a", needs=("c",)), Node("b", needs=("a",)), Node("c", needs=("b",))],
        "cycle (each needs the next): a -> c -> b -> a",
    ),
    ("self cycle", [Node("a", needs=("a",))], "cycle (each needs the next): a -> a"),
    ("unknown handler", [Node("a", catch="h")], "step 'a' is caught by 'h': not a step"),
    ("own handler", [Node("a", catch="a")], "step 'a' cannot catch its own failure"),
    (
        "handler twice",
        [Node("a", catch="h"), Node("b", needs=(), catch="h"), Node("h")],
        "catch handler 'h' handles both 'a' and 'b'",
    ),
    (
        "handler with needs",
        [Node("a", catch="h"), Node("h", needs=("a",))],
        "catch handler 'h' of 'a' cannot need other steps",
    ),
    (
        "handler with predicate",
        [Node("a", catch="h"), Node("h", when=True)],
        "catch handler 'h' cannot have a predicate",
    ),
    (
        "finally handler",
        [Node("a", catch="h"), Node("h", is_finally=True)],
        "catch handler 'h' cannot be a finally step",
    ),
    (
        "handler needed",
        [Node("a", catch="h"), Node("h"), Node("b", needs=("h",))],
        "step 'b' needs catch handler 'h': need 'a'",
    ),
    (
        "switch caught",
        [Node("s", routes=("x",), catch="h"), Node("h"), Node("x", needs=("s",))],
        "switch 's' cannot have a catch handler",
    ),
    ("route to no step", [Node("s", routes=("x",))], "switch 's' routes to 'x': not a step"),
    (
        "route to a step that does not need the switch",
        [Node("s", routes=("x",)), Node("x", needs=())],
        "switch 's' routes to 'x', which does not need it",
    ),
    (
        "route to finally",
        [Node("s", routes=("f",)), Node("f", needs=("s",), is_finally=True)],
        "switch 's' routes to finally step 'f'",
    ),
    (
        "finally needed",
        [Node("a"), Node("f", is_finally=True), Node("b", needs=("f",))],
        "step 'b' needs finally step 'f'",
    ),
    (
        "finally caught",
        [Node("f", is_finally=True, catch="h"), Node("h")],
        "finally step 'f' cannot have a catch handler",
    ),
    (
        "fan-out limit 0",
        [Node("m", fan_out=FanOutLimits(0))],
        "fan-out step 'm' needs max_in_flight of 1 or more, got 0",
    ),
    (
        "negative count",
        [Node("m", fan_out=FanOutLimits(2, Tolerance(count=-1)))],
        "fan-out step 'm' tolerates -1 failures: below 0",
    ),
    (
        "percentage above 100",
        [Node("m", fan_out=FanOutLimits(2, Tolerance(percent=100.5)))],
        "fan-out step 'm' tolerates 100.5%: not in 0-100",
    ),
    (
        "percentage below 0",
        [Node("m", fan_out=FanOutLimits(2, Tolerance(percent=-1)))],
        "fan-out step 'm' tolerates -1%: not in 0-100",
    ),
    (
        "count and percentage",
        [Node("m", fan_out=FanOutLimits(2, Tolerance(count=1, percent=5)))],
        "fan-out step 'm': a tolerance is a count or a percentage",
    ),
]


@pytest.mark.parametrize(
    ("nodes", "message"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED]
)
def test_a_bad_definition_is_refused_naming_the_step(nodes: list[Node], message: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        build_graph(nodes)
    assert message in str(refused.value)


def test_an_unknown_rule_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="step 'a' has an unknown rule 'most'"):
        build_graph([Node("a", rule="most")])  # type: ignore[arg-type]


def test_tolerances_are_inclusive() -> None:
    ten_percent = Tolerance(percent=10)
    assert ten_percent.allows(20, 200)
    assert not ten_percent.allows(21, 200)
    assert Tolerance(count=3).allows(3, 10)
    assert not Tolerance(count=3).allows(4, 10)
    assert Tolerance().allows(0, 10)
    assert not Tolerance().allows(1, 10)
    # The percentage as written: 0.1 + 0.2 style binary error does not refuse 3 of 1000.
    assert Tolerance(percent=0.3).allows(3, 1000)
    assert not Tolerance(percent=0.3).allows(4, 1000)


def test_a_compensator_keeps_its_steps_place_in_the_graph() -> None:
    """Registering a compensator kept the step's spec but dropped its node and predicate:
    a compensated step with needs became the step after the one before it."""
    pipeline = Pipeline("unwind")
    pipeline.step("open")(lambda v: v)
    pipeline.step("a", needs=["open"], when=lambda v: True)(lambda v: v)
    pipeline.step("b", needs=["open"], rule="all_done")(lambda v: v)
    for name in ("open", "a", "b"):
        pipeline.compensate(name)(lambda v: None)
    graph = pipeline.spec().graph
    assert graph is not None
    assert [graph.needs(n) for n in ("open", "a", "b")] == [(), ("open",), ("open",)]
    assert graph.by_name["b"].rule == "all_done"
    assert graph.by_name["a"].when is True
    assert all(step.compensator is not None for step in pipeline.steps)
    assert pipeline.steps[1].predicate is not None
