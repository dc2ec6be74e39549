"""The graph planner: given where a run's nodes stand, what happens next.

``plan`` is pure. The engine calls it after any node settles, with the states folded
from the facts, the route decisions recorded so far (switch to chosen routes) and the
predicate decisions (node to ``when`` result); it records what the plan says in the
same commit. Within one call the plan runs to a fixpoint, so a skip propagates
through as many levels as it reaches. In the plan:

- ``ready``: nodes to start, in step order. A node with a predicate and no decision
  yet is ready: its worker evaluates the predicate first, and the engine records the
  decision; a false decision then skips the node (``predicate_false``).
- ``skipped``: nodes to skip with their reason, in the order decided (a cause before
  its effect). ``readiness_unsatisfied``: the rule can no longer hold (seed 004's
  truth table, ``processor.model.readiness``). ``predicate_false``: the predicate was
  false, or the node is a route its switch did not choose.
- ``caught``: catch decisions to record, ``(failed node, its handler)``. From then on
  the failed node is ``caught`` and its handler runs. Until the handler settles, the
  caught node is still running for its successors; then it counts as ``caught`` (a
  success) if the handler succeeded, ``failed`` if the handler failed (and so on down
  a handler's own handler). A handler whose step did not fail is skipped
  (``readiness_unsatisfied``).

Routes: a route target that its switch did not choose is skipped (``predicate_false``)
whatever its other needs; a chosen one follows its rule as usual, so a join after a
switch runs after what was selected with ``none_failed`` and is skipped with
``all_success``. A target waits for its switches to decide, whatever its rule (even
``always``), unless a switch failed or was skipped: then it follows its rule. The
engine records a switch's decision in the commit that records its success.

Finally nodes are ready once every other node is settled, whatever the outcome.

The run's outcome, once every node is settled (``outcome``; ``work_outcome`` is the
same judgement before the finally nodes, for the engine to record as the intended
outcome): **failed if any node failed unhandled, succeeded otherwise**. A failure is
handled only by a catch; an ``all_done`` or ``one_failed`` successor that ran after
it does not handle it (it is an error branch: notify, clean up), so the run still
fails. A finally node that fails fails the run (seed 004: cleanup failure always
wins); one that succeeds changes nothing. Skipped nodes do not fail a run. Airflow
judges a run by its leaf tasks only, which lets an error branch turn a failure into a
success silently; here that takes a catch, which is explicit.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Literal

from processor.model.graph import Graph, Node
from processor.model.readiness import TERMINAL, NodeStatus, Readiness, evaluate

__all__ = [
    "CAUGHT",
    "FAILED",
    "PENDING",
    "RUNNING",
    "SUCCEEDED",
    "NodeState",
    "Plan",
    "RunOutcome",
    "SkipReason",
    "plan",
    "skipped",
]

SkipReason = Literal["readiness_unsatisfied", "predicate_false"]
RunOutcome = Literal["succeeded", "failed"]
_Which = Callable[["Node"], bool]


@dataclass(frozen=True, slots=True)
class NodeState:
    """Where one node of a run stands; ``reason`` only for ``skipped``."""

    status: NodeStatus = "pending"
    reason: SkipReason | None = None


PENDING = NodeState()
RUNNING = NodeState("running")
SUCCEEDED = NodeState("succeeded")
FAILED = NodeState("failed")
CAUGHT = NodeState("caught")


def skipped(reason: SkipReason) -> NodeState:
    """The state of a node skipped for ``reason``."""
    return NodeState("skipped", reason)


@dataclass(frozen=True, slots=True)
class Plan:
    """What the engine records and starts next (see the module doc)."""

    ready: tuple[str, ...] = ()
    skipped: tuple[tuple[str, SkipReason], ...] = ()
    caught: tuple[tuple[str, str], ...] = ()
    work_outcome: RunOutcome | None = None
    outcome: RunOutcome | None = None


def plan(
    graph: Graph,
    states: Mapping[str, NodeState],
    routes: Mapping[str, Collection[str]] | None = None,
    predicates: Mapping[str, bool] | None = None,
) -> Plan:
    """What to do next; a node missing from ``states`` is pending."""
    planner = _Planner(graph, states, routes or {}, predicates or {})
    while planner.advance_all():
        pass
    ready = sorted(planner.ready, key=[n.name for n in graph.nodes].index)
    return Plan(
        tuple(ready),
        tuple(planner.skips),
        tuple(planner.catches),
        planner.outcome(lambda n: not n.is_finally),
        planner.outcome(lambda n: True),
    )


@dataclass
class _Planner:
    """One call's working copy: nodes it starts count as running, its skips as skipped."""

    graph: Graph
    given: Mapping[str, NodeState]
    routes: Mapping[str, Collection[str]]
    predicates: Mapping[str, bool]
    states: dict[str, NodeState] = field(default_factory=dict)
    ready: list[str] = field(default_factory=list)
    skips: list[tuple[str, SkipReason]] = field(default_factory=list)
    catches: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.states = {n.name: self.given.get(n.name, PENDING) for n in self.graph.nodes}

    def advance_all(self) -> bool:
        """One pass in step order; whether anything changed."""
        return any([self._advance(node) for node in self.graph.nodes])

    def _advance(self, node: Node) -> bool:
        status = self.states[node.name].status
        if status in ("pending", "running") and self._predicate_false(node):
            return self._skip(node.name, "predicate_false")
        if status == "failed" and node.catch is not None:
            return self._catch(node.name, node.catch)
        if status != "pending":
            return False
        if self._unselected(node):
            return self._skip(node.name, "predicate_false")
        match self._readiness(node):
            case "ready":
                self.ready.append(node.name)
                self.states[node.name] = RUNNING
                return True
            case "skip":
                return self._skip(node.name, "readiness_unsatisfied")
            case "wait":
                return False

    def _readiness(self, node: Node) -> Readiness:
        if node.is_finally:
            return "ready" if self._settled(lambda n: not n.is_finally) else "wait"
        handled = self.graph.handles.get(node.name)
        if handled is not None:
            return self._handler_readiness(handled)
        if self._undecided(node):
            return "wait"
        return evaluate(node.rule, (self._seen(need) for need in self.graph.needs(node.name)))

    def _handler_readiness(self, handled: str) -> Readiness:
        status = self.states[handled].status
        if status == "caught":
            return "ready"
        return "skip" if status in TERMINAL and status != "failed" else "wait"

    def _unselected(self, node: Node) -> bool:
        """A route target that one of its switches decided against."""
        return any(
            switch in self.routes and node.name not in self.routes[switch]
            for switch in self.graph.switches_of.get(node.name, ())
        )

    def _undecided(self, node: Node) -> bool:
        """A route target of a switch that may still decide (it did not fail or skip)."""
        return any(
            switch not in self.routes and self.states[switch].status not in ("failed", "skipped")
            for switch in self.graph.switches_of.get(node.name, ())
        )

    def _predicate_false(self, node: Node) -> bool:
        return node.when and self.predicates.get(node.name) is False

    def _seen(self, name: str) -> NodeStatus:
        """A node's outcome as its successors see it: a caught node's is its handler's.

        A failed node with a handler is as good as caught: its catch is being decided.
        """
        status = self.states[name].status
        handler = self.graph.by_name[name].catch
        if status not in ("failed", "caught") or handler is None:
            return status
        seen = self._seen(handler)
        return "caught" if seen == "succeeded" else seen

    def _skip(self, name: str, reason: SkipReason) -> bool:
        self.states[name] = skipped(reason)
        self.skips.append((name, reason))
        return True

    def _catch(self, name: str, handler: str) -> bool:
        self.states[name] = CAUGHT
        self.catches.append((name, handler))
        return True

    def _settled(self, among: _Which) -> bool:
        return all(self.states[n.name].status in TERMINAL for n in self.graph.nodes if among(n))

    def outcome(self, among: _Which) -> RunOutcome | None:
        if not self._settled(among):
            return None
        failed = (self.states[n.name].status == "failed" for n in self.graph.nodes if among(n))
        return "failed" if any(failed) else "succeeded"
