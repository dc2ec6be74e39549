"""The planner, driven to the end on random graphs, agrees with a naive reference model.

A random graph has up to 12 nodes: steps needing earlier steps with random rules and
predicates, switches routing to some of the steps that need them, catch handlers,
and a finally step. An oracle says how each node that runs turns out (its predicate,
its success or failure, a switch's routes). The planner is called over and over,
running nodes settling in a random order, until the run has an outcome. The
reference model visits the nodes once, in declaration order (every need is declared
earlier), and decides each node's fate from the final fates of its needs.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from processor.model.graph import Graph, Node, build_graph
from processor.model.graph_plan import (
    CAUGHT,
    FAILED,
    RUNNING,
    SUCCEEDED,
    NodeState,
    SkipReason,
    plan,
    skipped,
)
from processor.model.readiness import RULES, Rule


@dataclass(frozen=True)
class Oracle:
    """How each node turns out if it runs."""

    succeeds: Mapping[str, bool]
    predicate: Mapping[str, bool]
    routes: Mapping[str, frozenset[str]]


@dataclass(frozen=True)
class Fates:
    """What happened to a run: who ran, who was skipped and why, and its outcome."""

    executed: frozenset[str]
    skipped: Mapping[str, SkipReason]
    outcome: str


@st.composite
def graphs(draw: st.DrawFn) -> tuple[Graph, Oracle]:
    mains = draw(st.integers(1, 9))
    names = [f"n{i}" for i in range(mains)]
    needs = {
        n: draw(st.lists(st.sampled_from(names[:i]), unique=True)) if i else []
        for i, n in enumerate(names)
    }
    switches = {n for n in names if draw(st.booleans()) and draw(st.booleans())}
    routes = {
        s: [t for t in names if s in needs[t] and draw(st.booleans())] for s in sorted(switches)
    }
    caught = [n for n in names if n not in switches and draw(st.integers(0, 3)) == 0]
    caught = caught[: 12 - mains - 1]
    nodes: list[Node] = []
    for name in names:
        nodes.append(
            Node(
                name,
                needs=tuple(needs[name]),
                rule=draw(st.sampled_from(RULES)),
                when=draw(st.integers(0, 3)) == 0,
                routes=tuple(routes.get(name, ())),
                catch=f"h_{name}" if name in caught else None,
            )
        )
        if name in caught:
            nodes.append(Node(f"h_{name}"))
    if draw(st.booleans()):
        finally_needs = draw(st.lists(st.sampled_from(names), unique=True))
        nodes.append(
            Node("fin", needs=tuple(finally_needs), is_finally=True, when=draw(st.booleans()))
        )
    all_names = [n.name for n in nodes]
    oracle = Oracle(
        succeeds={n: draw(st.integers(0, 2)) > 0 for n in all_names},
        predicate={n: draw(st.integers(0, 3)) > 0 for n in all_names},
        routes={s: frozenset(t for t in r if draw(st.booleans())) for s, r in routes.items()},
    )
    return build_graph(nodes), oracle


def drive(graph: Graph, oracle: Oracle, order: random.Random) -> Fates:
    """Call the planner until the run has an outcome, settling running nodes in any order."""
    states: dict[str, NodeState] = {}
    routes: dict[str, frozenset[str]] = {}
    predicates: dict[str, bool] = {}
    executed: set[str] = set()
    for _ in range(10 * len(graph.nodes) + 10):
        step = plan(graph, states, routes, predicates)
        states |= {name: skipped(reason) for name, reason in step.skipped}
        states |= {name: CAUGHT for name, _ in step.caught}
        states |= dict.fromkeys(step.ready, RUNNING)
        if step.outcome is not None:
            reasons = {n: s.reason for n, s in states.items() if s.reason is not None}
            return Fates(frozenset(executed), reasons, step.outcome)
        running = sorted(n for n, s in states.items() if s.status == "running")
        assert running, f"stuck: {states}"
        name = order.choice(running)
        node = graph.by_name[name]
        if node.when and name not in predicates:
            predicates[name] = oracle.predicate[name]
            if not predicates[name]:
                continue  # the planner skips it
        executed.add(name)
        states[name] = SUCCEEDED if oracle.succeeds[name] else FAILED
        if node.routes and oracle.succeeds[name]:
            routes[name] = oracle.routes[name]
    raise AssertionError("the planner did not finish")


# The truth table when every need is settled: (all settled, so no rule waits).
TERMINAL_RULES: dict[Rule, Callable[[list[str]], bool]] = {
    "all_success": lambda seen: all(s in ("succeeded", "caught") for s in seen),
    "all_done": lambda seen: True,
    "one_failed": lambda seen: "failed" in seen,
    "all_failed": lambda seen: bool(seen) and all(s == "failed" for s in seen),
    "none_failed": lambda seen: "failed" not in seen,
    "always": lambda seen: True,
}


def reference(graph: Graph, oracle: Oracle) -> Fates:
    """Each node once, in declaration order, from its needs' final fates."""
    fate: dict[str, str] = {}
    reasons: dict[str, SkipReason] = {}
    handles = {n.catch: n.name for n in graph.nodes if n.catch}

    def seen(name: str) -> str:
        handler = graph.by_name[name].catch
        if fate[name] == "caught" and handler is not None:
            return "caught" if seen(handler) in ("succeeded", "caught") else seen(handler)
        return fate[name]

    def runs(node: Node) -> bool:
        if node.name in handles:
            return fate[handles[node.name]] == "caught"
        if node.is_finally:
            return True
        for switch in graph.switches_of.get(node.name, ()):
            if fate[switch] == "succeeded" and node.name not in oracle.routes[switch]:
                reasons[node.name] = "predicate_false"
                return False
        return TERMINAL_RULES[node.rule]([seen(need) for need in graph.needs(node.name)])

    for node in graph.nodes:
        if not runs(node):
            reasons.setdefault(node.name, "readiness_unsatisfied")
            fate[node.name] = "skipped"
        elif node.when and not oracle.predicate[node.name]:
            reasons[node.name] = "predicate_false"
            fate[node.name] = "skipped"
        elif oracle.succeeds[node.name]:
            fate[node.name] = "succeeded"
        else:
            fate[node.name] = "caught" if node.catch else "failed"
    executed = frozenset(n for n in fate if n not in reasons)
    outcome = "failed" if "failed" in fate.values() else "succeeded"
    return Fates(executed, reasons, outcome)


@settings(max_examples=400, deadline=None)
@given(graph_and_oracle=graphs(), order=st.randoms(use_true_random=False))
def test_the_planner_agrees_with_the_reference_model(
    graph_and_oracle: tuple[Graph, Oracle], order: random.Random
) -> None:
    graph, oracle = graph_and_oracle
    assert drive(graph, oracle, order) == reference(graph, oracle)
