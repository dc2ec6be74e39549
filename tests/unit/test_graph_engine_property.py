"""Random graph runs folded by the engine agree with a reference model of the rules.

A random graph has up to 12 steps: main steps needing earlier ones with random
readiness rules, switches routing to some of the steps that need them, catch
handlers, fan-out steps (each mapping over the list of the step before it, 0 to 8
items, 1 to 4 in flight, fail-fast or a count or a percentage of failed items
tolerated), steps guarded by a predicate (``when``), and maybe a finally step. Each
step, and each fan-out item, has an outcome, drawn too: it succeeds, fails for good,
fails once and then succeeds on its retry, or (a switch) chooses a route that it did
not declare; each predicate says yes or no (its worker then answers the step with a
``skipped`` result). The run is driven through the engine's pure decisions
(``decide_submit``, ``decide_result``, ``decide_timer``) with every fact folded by
``reduce.fold``, exactly as the processor loop does but without a log: the work items
the decisions emit are answered in a random order (some twice, as an at-least-once
transport may), and due retry timers fire when no work is left.

The reference model below knows nothing of the planner (``graph_plan``): it visits the
steps once, in declaration order (every need is declared earlier, a handler right
after the step it handles, the finally step last), and decides each step's fate from
the final fates of its needs with the README's truth table; a fan-out step fails on
an input that is no list or when more items fail than tolerated (inclusive), and
otherwise releases its items' outputs in item order with the failed ones' errors. The
engine's history must give the same steps run, the same steps skipped with the same
reasons, the same outcome and result, and each step's input as the README says; and
the bookkeeping must hold: one ``NodeReady`` per step run, one ``NodeSettled`` per
lane, one ``StepCompleted`` per step, each fan-out item started and settled at most
once (lowest index first, every item when the step succeeded) and never more items
open than the step's limit, no fact key twice, one terminal fact.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

from hypothesis import given, settings
from hypothesis import strategies as st

from processor.clients.client import new_submit
from processor.facts.models import (
    CancelRun,
    CatchDecided,
    FactHeader,
    FanOutItemSettled,
    GraphSettled,
    NodeReady,
    NodeSettled,
    NodeSkipped,
    RouteDecided,
    RunFailed,
    RunStopped,
    RunStopRequested,
    RunSucceeded,
    SegmentResult,
    StepCompleted,
    StepOutput,
    WorkItem,
)
from processor.facts.topics import TopicName
from processor.model.decide import (
    Context,
    Decision,
    TimerFired,
    decide_result,
    decide_submit,
    decide_timer,
)
from processor.model.due import due_entries
from processor.model.graph import FanOutLimits, Node, Tolerance, build_graph
from processor.model.lanes import item_of
from processor.model.operator import decide_cancel
from processor.model.pipeline_spec import PipelineSpec, RetryPolicy, StepSpec
from processor.model.readiness import RULES, Rule
from processor.model.reduce import fold
from processor.model.state import RunState

#: ``flaky``: fails once, then succeeds on its retry; ``exhausted``: fails both attempts;
#: ``fail``: fails for good at once (not retryable); ``bad_route``: a switch's bad choice.
Outcome = Literal["ok", "fail", "flaky", "exhausted", "bad_route"]
#: Rules that may start a step before all its needs settle: its input depends on timing.
EARLY: frozenset[Rule] = frozenset({"always", "one_failed"})
#: Such an input (or one that holds the input a switch of those rules passes on).
UNKNOWN = object()
#: Rules a fan-out step may have: it starts once its one need (its list) settled.
SETTLED_RULES: tuple[Rule, ...] = tuple(r for r in RULES if r not in EARLY)
BACKOFF_MS = 10
RUN_INPUT = {"order": 7}


@dataclass(frozen=True)
class Case:
    """A random graph and how each of its steps turns out when it runs."""

    nodes: tuple[Node, ...]
    outcomes: dict[str, Outcome]
    choices: dict[str, tuple[str, ...]]  # a switch's chosen routes (when it succeeds)
    #: A feeder's list length (it returns ``list(range(n))``; a fan-out step needs it).
    feeds: dict[str, int] = field(default_factory=dict)
    #: A fan-out step's feeder, and how each of its items turns out, by item index.
    fans: dict[str, str] = field(default_factory=dict)
    items: dict[str, tuple[Outcome, ...]] = field(default_factory=dict)
    #: What a step's predicate (``when``) says, for each step that has one.
    predicates: dict[str, bool] = field(default_factory=dict)

    def spec(self) -> PipelineSpec:
        retry = RetryPolicy(max_attempts=2, initial_backoff_ms=BACKOFF_MS)
        steps = tuple(StepSpec(node.name, retry) for node in self.nodes)
        return PipelineSpec("random_graph", 1, steps, graph=build_graph(self.nodes))

    def output(self, name: str) -> Any:
        """What the step returns when it succeeds (a fan-out step: its released output)."""
        if name in self.choices:
            return list(self.choices[name])
        if name in self.feeds:
            return list(range(self.feeds[name]))
        if name in self.fans:
            outcomes = self.items[name]
            failed = [i for i, outcome in enumerate(outcomes) if not succeeds(outcome)]
            return {
                "items": [None if i in failed else item_output(i) for i in range(len(outcomes))],
                "failed": [
                    {"item": i, "type": "RuntimeError", "message": f"{name}[{i}] broke"}
                    for i in failed
                ],
            }
        return {"from": name}


def succeeds(outcome: Outcome) -> bool:
    """Whether a step (or a fan-out item) with this outcome succeeds in the end."""
    return outcome in ("ok", "flaky")


def item_output(item: int) -> Any:
    """What a fan-out item returns when it succeeds."""
    return {"item": item}


@st.composite
def cases(draw: st.DrawFn) -> Case:
    mains = draw(st.integers(1, 9))
    names = [f"n{i}" for i in range(mains)]
    needs = {
        n: draw(st.lists(st.sampled_from(names[:i]), unique=True)) if i else []
        for i, n in enumerate(names)
    }
    # A fan-out step maps over its one need's list: that need is a feeder of its own.
    fans: dict[str, str] = {}
    for i in range(1, mains):
        feeder = names[i - 1]
        if feeder not in fans and feeder not in fans.values() and draw(st.integers(0, 2)) == 0:
            fans[names[i]] = feeder
            needs[names[i]] = [feeder]
    special = set(fans) | set(fans.values())
    plain_names = [n for n in names if n not in special]
    switches = [n for n in plain_names if draw(st.booleans())]
    routes = {s: [t for t in names if s in needs[t] and draw(st.integers(0, 3))] for s in switches}
    routes = {s: r for s, r in routes.items() if r}  # a switch routes somewhere
    budget = 12 - mains - 1  # steps left for handlers, keeping one for finally
    caught = [n for n in plain_names if n not in routes and draw(st.integers(0, 3)) == 0][:budget]
    guarded = [n for n in plain_names if n not in routes and n not in caught]
    predicates = {n: draw(st.booleans()) for n in guarded if draw(st.integers(0, 3)) == 0}
    nodes: list[Node] = []
    for name in names:
        nodes.append(
            Node(
                name,
                needs=tuple(needs[name]),
                rule=draw(st.sampled_from(SETTLED_RULES if name in fans else RULES)),
                when=name in predicates,
                routes=tuple(routes.get(name, ())),
                catch=f"h_{name}" if name in caught else None,
                fan_out=draw(fan_out_limits()) if name in fans else None,
            )
        )
        if name in caught:
            nodes.append(Node(f"h_{name}", needs=()))
    if draw(st.booleans()):
        reads = draw(st.lists(st.sampled_from(names), unique=True))
        nodes.append(Node("fin", needs=tuple(reads), is_finally=True))
    plain: list[Outcome] = ["ok", "ok", "fail", "flaky", "exhausted"]
    outcomes: dict[str, Outcome] = {
        n.name: draw(st.sampled_from([*plain, "bad_route"] if n.routes else plain)) for n in nodes
    }
    feeds = {feeder: draw(st.integers(0, 8)) for feeder in fans.values()}
    items = {
        fan: tuple(draw(st.lists(st.sampled_from(plain), min_size=n, max_size=n)))
        for fan, n in ((fan, feeds[feeder]) for fan, feeder in fans.items())
    }
    choices = {  # one route, mostly; sometimes several
        s: tuple(
            draw(
                st.lists(
                    st.sampled_from(r), min_size=1, max_size=draw(st.integers(1, 2)), unique=True
                )
            )
        )
        for s, r in routes.items()
    }
    return Case(tuple(nodes), outcomes, choices, feeds, fans, items, predicates)


@st.composite
def fan_out_limits(draw: st.DrawFn) -> FanOutLimits:
    """At most 1 to 4 items in flight; fail-fast, a count or a percentage tolerated."""
    kind = draw(st.sampled_from(["fail_fast", "count", "percent"]))
    tolerance = Tolerance()
    if kind == "count":
        tolerance = Tolerance(count=draw(st.integers(0, 3)))
    elif kind == "percent":
        tolerance = Tolerance(percent=draw(st.sampled_from([0, 12.5, 25, 50, 100])))
    return FanOutLimits(draw(st.integers(1, 4)), tolerance)


# --- the reference model ---------------------------------------------------------------------

Fate = Literal["succeeded", "failed", "caught", "skipped"]


def rule_holds(rule: Rule, seen: list[Fate]) -> bool:
    """The README's truth table, once every need has settled (so no rule waits)."""
    good = [s in ("succeeded", "caught") for s in seen]
    failed = [s == "failed" for s in seen]
    return {
        "all_success": all(good),
        "all_done": True,
        "one_failed": any(failed),
        "all_failed": bool(seen) and all(failed),
        "none_failed": not any(failed),
        "always": True,
    }[rule]


def tolerated(limits: FanOutLimits, failures: int, total: int) -> bool:
    """The README's tolerance, inclusive: a count of items or a percentage of them."""
    tolerance = limits.tolerance
    if tolerance.percent is None:
        return failures <= (tolerance.count or 0)
    return Fraction(failures * 100) <= Fraction(str(tolerance.percent)) * total


@dataclass
class Expected:
    executed: set[str] = field(default_factory=set)
    #: Ready, but its predicate said no: skipped ``predicate_false`` once it was asked.
    guarded_out: set[str] = field(default_factory=set)
    skipped: dict[str, str] = field(default_factory=dict)
    outcome: str = "succeeded"
    result: Any = None
    inputs: dict[str, Any] = field(default_factory=dict)  # of the steps that ran


def reference(case: Case) -> Expected:
    by_name = {n.name: n for n in case.nodes}
    handled_by = {n.catch: n.name for n in case.nodes if n.catch}
    switches_of = {t: [s for s in case.choices if t in by_name[s].routes] for t in by_name}
    fate: dict[str, Fate] = {}
    out = Expected()

    def seen(name: str) -> Fate:
        """A step's fate as the steps needing it see it: a caught one's is its handler's."""
        catch = by_name[name].catch
        if fate[name] == "caught" and catch is not None:
            return "caught" if seen(catch) in ("succeeded", "caught") else "failed"
        return fate[name]

    def output_seen(name: str) -> Any:
        """A step's output as the steps needing it see it (null: skipped or failed)."""
        node = by_name[name]
        if fate[name] == "caught" and node.catch is not None:
            return output_seen(node.catch)
        if fate[name] != "succeeded":
            return None
        if node.routes:  # a switch passes its input on
            return UNKNOWN if node.rule in EARLY else input_of(node)
        return case.output(name)

    def input_of(node: Node) -> Any:
        if node.name in handled_by:
            failed = handled_by[node.name]
            attempts = 2 if case.outcomes[failed] == "exhausted" else 1
            return {"type": "RuntimeError", "message": f"{failed} broke"} | {
                "attempt": attempts,
                "step": failed,
            }
        needs = node.needs or ()
        if not needs:
            return RUN_INPUT
        if len(needs) == 1:
            return output_seen(needs[0])
        outputs = {need: output_seen(need) for need in needs}
        return UNKNOWN if UNKNOWN in outputs.values() else outputs

    def runs(node: Node) -> bool:
        if node.name in handled_by:
            return fate[handled_by[node.name]] == "caught"
        if node.is_finally:
            return True
        for switch in switches_of[node.name]:
            if fate[switch] == "succeeded" and node.name not in case.choices[switch]:
                out.skipped[node.name] = "predicate_false"
                return False
        return rule_holds(node.rule, [seen(need) for need in node.needs or ()])

    def fan_out_fate(node: Node, given: Any) -> Fate:
        """A fan-out step fails on an input that is no list, or beyond its tolerance."""
        if not isinstance(given, list):
            return "failed"
        assert node.fan_out is not None and len(given) == len(case.items[node.name])
        failures = sum(not succeeds(o) for o in case.items[node.name])
        return "succeeded" if tolerated(node.fan_out, failures, len(given)) else "failed"

    for node in case.nodes:
        if not runs(node):
            out.skipped.setdefault(node.name, "readiness_unsatisfied")
            fate[node.name] = "skipped"
            continue
        given = input_of(node)
        if node.rule not in EARLY and given is not UNKNOWN:
            out.inputs[node.name] = given
        if case.predicates.get(node.name) is False:
            out.guarded_out.add(node.name)
            out.skipped[node.name] = "predicate_false"
            fate[node.name] = "skipped"
            continue
        out.executed.add(node.name)
        if node.fan_out is not None:
            fate[node.name] = fan_out_fate(node, given)
        elif succeeds(case.outcomes[node.name]):
            fate[node.name] = "succeeded"
        else:
            fate[node.name] = "caught" if node.catch else "failed"
    # Any failure no catch handled fails the run (a failing handler is one).
    out.outcome = "failed" if "failed" in fate.values() else "succeeded"
    # The result: the last main step declared that succeeded, or its handler's output.
    mains = [n for n in case.nodes if not n.is_finally and n.name not in handled_by]
    last = [n for n in mains if fate[n.name] in ("succeeded", "caught")]
    if last:
        node = last[-1]
        out.result = case.output(
            node.catch or node.name if fate[node.name] == "caught" else node.name
        )
    return out


# --- the engine, driven by hand --------------------------------------------------------------


class Catalog:
    def __init__(self, spec: PipelineSpec) -> None:
        self.spec = spec

    def latest(self, name: str) -> PipelineSpec | None:
        return self.spec if name == self.spec.name else None

    def get(self, name: str, version: int) -> PipelineSpec | None:
        return self.spec if (name, version) == (self.spec.name, self.spec.version) else None


@dataclass
class Engine:
    case: Case
    order: random.Random
    now: int = 1_000_000
    state: RunState | None = None
    facts: list[FactHeader] = field(default_factory=list)
    work: list[WorkItem] = field(default_factory=list)
    answered: list[SegmentResult] = field(default_factory=list)
    attempts: Counter[tuple[str, int | None]] = field(default_factory=Counter)
    cancel_after: int | None = None  # cancel once this many results were answered
    cancel_refusal: str | None = None

    def __post_init__(self) -> None:
        self.spec = self.case.spec()
        self.catalog = Catalog(self.spec)

    @property
    def ctx(self) -> Context:
        return Context(self.catalog, self.now)

    def take(self, decision: Decision) -> Decision:
        self.facts.extend(decision.facts)
        self.state = fold(decision.facts, self.state)
        for emit in decision.emits:
            if emit.topic == TopicName.WORK:
                assert isinstance(emit.value, WorkItem)
                self.work.append(emit.value)
        return decision

    def run(self) -> RunState:
        command = new_submit(self.spec.name, RUN_INPUT, now_ms=self.now)
        decision = self.take(decide_submit(command, None, self.ctx))
        assert decision.refusal is None, decision.detail
        for _ in range(1000):
            assert self.state is not None
            if self.state.terminal:
                break
            if self.cancel_after is not None and len(self.answered) >= self.cancel_after:
                self.cancel()
            elif self.work:
                self.answer(self.work.pop(self.order.randrange(len(self.work))))
            elif self.answered and self.order.random() < 0.2:
                self.duplicate(self.order.choice(self.answered))
            else:
                self.fire_timers()
        assert self.state is not None and self.state.terminal, self.state
        for result in self.answered:  # every answer again, after the end: all refused
            self.duplicate(result)
        return self.state

    def answer(self, item: WorkItem) -> None:
        name = self.spec.steps[item.first_step].name
        index = item_of(item.segment)
        self.attempts[name, index] += 1
        if index is None:
            outcome, value, label = self.case.outcomes[name], self.case.output(name), name
        else:  # an item of a fan-out step
            outcome, value = self.case.items[name][index], item_output(index)
            label = f"{name}[{index}]"
        fails = outcome in ("fail", "exhausted") or (
            outcome == "flaky" and self.attempts[name, index] == 1
        )
        if outcome == "bad_route":
            value = ["nowhere"]
        common = {
            "result_id": f"r-{len(self.answered)}",
            "run_id": item.run_id,
            "segment": item.segment,
            "attempt": item.attempt,
            "generation": item.generation,
            "worker_id": "w",
        }
        if self.case.predicates.get(name) is False:  # its worker asks the predicate first
            result = SegmentResult(**common, steps=(), outcome="skipped")
        else:
            result = SegmentResult(
                **common,
                steps=() if fails else (StepOutput(step=item.first_step, output=_json(value)),),
                outcome="failed" if fails else "completed",
                failed_step=item.first_step if fails else None,
                error=f"{label} broke" if fails else None,
                error_type="RuntimeError" if fails else None,
                retryable=outcome in ("flaky", "exhausted"),
            )
        self.answered.append(result)
        decision = self.take(decide_result(result, self.state, self.ctx))
        assert decision.refusal is None, decision.detail

    def cancel(self) -> None:
        assert self.state is not None
        command = CancelRun(
            command_id="cancel-1", run_id=self.state.run_id, reason="test", requested_ms=self.now
        )
        decision = self.take(decide_cancel(command, self.state, self.ctx))
        self.cancel_after, self.cancel_refusal = None, decision.refusal

    def duplicate(self, result: SegmentResult) -> None:
        """An answer delivered again (at least once): refused, nothing recorded."""
        decision = self.take(decide_result(result, self.state, self.ctx))
        assert decision.refusal == "stale_attempt" and not decision.facts, decision

    def fire_timers(self) -> None:
        self.now += BACKOFF_MS
        for entry in sorted(e for e in due_entries(self.state) if e.due_ms <= self.now):
            self.take(decide_timer(TimerFired(entry), self.state, self.ctx))


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def assert_ready_in_order(case: Case, facts: list[FactHeader]) -> None:
    """Each step started only once what it waits for was in the history: its needs
    settled (unless its rule may start early), its switches' choices, the failure it
    handles caught, and for a finally step every other step."""
    names = [n.name for n in case.nodes]
    done: set[str] = set()  # settled or skipped so far
    caught: set[str] = set()
    decided: set[str] = set()
    for fact in facts:
        if isinstance(fact, NodeSettled | NodeSkipped):
            done.add(names[fact.step])
        elif isinstance(fact, CatchDecided):
            caught.add(names[fact.step])
        elif isinstance(fact, RouteDecided):
            decided.add(names[fact.step])
        elif isinstance(fact, NodeReady) and fact.item is None:
            node = case.nodes[fact.step]
            if node.is_finally:
                others = {n.name for n in case.nodes if not n.is_finally}
                assert others <= done, (node.name, others - done)
            elif node.catch is None and node.name in {n.catch for n in case.nodes}:
                handled = next(n.name for n in case.nodes if n.catch == node.name)
                assert handled in caught, node.name
            elif node.rule not in EARLY:
                needs = set(node.needs or ())
                handlers = {case.nodes[names.index(n)].catch for n in needs & caught}
                assert needs | (handlers - {None}) <= done, (node.name, needs - done)
            for switch, chosen in case.choices.items():
                if node.name in case.nodes[names.index(switch)].routes:
                    assert switch in done, (node.name, switch)  # it chose, or cannot
                    assert switch not in decided or node.name in chosen, (node.name, switch)


# --- the property ----------------------------------------------------------------------------


def assert_fan_outs(case: Case, facts: list[FactHeader], expected: Expected) -> None:
    """Each fan-out step's items: started lowest index first, each once, settled at
    most once, never more than its limit open; all of them when it succeeded, with its
    output in item order (the reference's ``Case.output``)."""
    names = [n.name for n in case.nodes]
    completed = {names[f.step]: json.loads(f.output) for f in facts if isinstance(f, StepCompleted)}
    for fan in case.fans:
        node = case.nodes[names.index(fan)]
        assert node.fan_out is not None
        step = names.index(fan)
        started = [f.item for f in facts if isinstance(f, NodeReady) and f.step == step]
        started = [i for i in started if i is not None]
        settled = [f.item for f in facts if isinstance(f, FanOutItemSettled) and f.step == step]
        assert started == list(range(len(started))), (fan, started)
        assert Counter(settled) == Counter(started), (fan, settled, started)
        open_items, most = 0, 0
        for fact in facts:
            if isinstance(fact, NodeReady) and fact.step == step and fact.item is not None:
                open_items += 1
                most = max(most, open_items)
            elif isinstance(fact, FanOutItemSettled) and fact.step == step:
                open_items -= 1
        assert most <= node.fan_out.max_in_flight, (fan, most)
        if fan not in expected.executed:
            assert started == [], fan
            continue
        given = expected.inputs.get(fan)
        if isinstance(given, list) and given:  # the first items start together
            assert most == min(node.fan_out.max_in_flight, len(given)), (fan, most)
        succeeded = [f for f in facts if isinstance(f, NodeSettled) and names[f.step] == fan]
        assert len(succeeded) == 1
        if succeeded[0].status == "succeeded":
            assert started == list(range(len(case.items[fan]))), (fan, started)
            assert completed[fan] == case.output(fan), (fan, completed[fan])
        else:
            assert fan not in completed, fan


@settings(max_examples=500, deadline=None)
@given(case=cases(), order=st.randoms(use_true_random=False))
def test_the_engine_folds_random_graphs_as_the_reference_model_says(
    case: Case, order: random.Random
) -> None:
    engine = Engine(case, order)
    final = engine.run()
    facts = engine.facts
    names = [n.name for n in case.nodes]
    expected = reference(case)

    ready = [names[f.step] for f in facts if isinstance(f, NodeReady) and f.item is None]
    skipped = {names[f.step]: f.reason for f in facts if isinstance(f, NodeSkipped)}
    assert set(ready) == expected.executed | expected.guarded_out
    assert skipped == expected.skipped
    ran = set(ready) - expected.guarded_out  # a false predicate: ready, then skipped
    assert ran.isdisjoint(skipped) and set(ready) | set(skipped) == set(names)

    # Each step that ran: once ready, its lane settled once, completed at most once.
    assert Counter(ready) == Counter(set(ready)), ready
    settled = Counter(names[f.step] for f in facts if isinstance(f, NodeSettled))
    assert settled == Counter(ran), settled
    completed = Counter(names[f.step] for f in facts if isinstance(f, StepCompleted))
    assert all(count == 1 for count in completed.values()), completed
    assert set(completed) <= set(ready)
    keys = Counter(f.fact_key for f in facts)
    assert [k for k, n in keys.items() if n > 1] == []
    assert [f.seq for f in facts] == list(range(1, len(facts) + 1))

    assert_ready_in_order(case, facts)

    # A switch's choice recorded once, and only by a switch that chose well.
    decided = {names[f.step]: f.routes for f in facts if isinstance(f, RouteDecided)}
    chose = {s: r for s, r in case.choices.items() if s in ready}
    assert decided == {s: r for s, r in chose.items() if case.outcomes[s] in ("ok", "flaky")}

    # What each step received (README: inputs by name, a handler gets the typed error).
    given_inputs = {
        names[f.step]: json.loads(f.input)
        for f in facts
        if isinstance(f, NodeReady) and f.item is None
    }
    assert {n: given_inputs[n] for n in expected.inputs} == expected.inputs

    assert_fan_outs(case, facts, expected)

    # The outcome, terminal exactly once, and the result.
    terminal = [f for f in facts if isinstance(f, RunSucceeded | RunFailed | RunStopped)]
    assert len(terminal) == 1 and terminal[0] is facts[-1]
    graph_settled = [f.outcome for f in facts if isinstance(f, GraphSettled)]
    assert graph_settled == [expected.outcome]
    assert final.status == expected.outcome
    if expected.outcome == "succeeded":
        assert isinstance(terminal[0], RunSucceeded)
        assert json.loads(terminal[0].result) == expected.result


def test_a_skipped_switch_passes_null_on_not_its_own_input() -> None:
    """A skipped (or failed) need is null for the steps after it, a switch too: a switch
    passes its input on only when it ran and chose (this was once its input anyway)."""
    case = Case(
        (
            Node("choose", needs=(), rule="one_failed", routes=("route",)),  # skipped
            Node("route", needs=("choose",), rule="all_done"),
        ),
        {"choose": "ok", "route": "ok"},
        {"choose": ("route",)},
    )
    engine = Engine(case, random.Random(0))
    assert engine.run().status == "succeeded"
    ready = [f for f in engine.facts if isinstance(f, NodeReady)]
    assert [(f.step, json.loads(f.input)) for f in ready] == [(1, None)]


def _fan_out_case(items: tuple[Outcome, ...], tolerance: Tolerance) -> Case:
    nodes = (
        Node("listing", needs=()),
        Node("each", needs=("listing",), fan_out=FanOutLimits(3, tolerance)),
        Node("after", needs=("each",)),
    )
    outcomes: dict[str, Outcome] = {"listing": "ok", "each": "ok", "after": "ok"}
    fans, feeds = {"each": "listing"}, {"listing": len(items)}
    return Case(nodes, outcomes, {}, feeds, fans, {"each": items})


def test_a_fan_out_passes_at_its_tolerance_and_fails_one_item_beyond_it() -> None:
    """12.5 % of 8 items is 1: one failed item passes (its error in the output, null in
    its place), two fail the step, and the step after it is skipped."""
    one: tuple[Outcome, ...] = ("ok", "exhausted", *(("flaky",) * 6))
    passing = Engine(_fan_out_case(one, Tolerance(percent=12.5)), random.Random(1))
    assert passing.run().status == "succeeded"
    result = next(f for f in passing.facts if isinstance(f, RunSucceeded)).result
    assert json.loads(result) == {"from": "after"}  # the last step's output
    each = next(f for f in passing.facts if isinstance(f, StepCompleted) and f.step == 1)
    assert json.loads(each.output) == {
        "items": [{"item": 0}, None, *({"item": i} for i in range(2, 8))],
        "failed": [{"item": 1, "type": "RuntimeError", "message": "each[1] broke"}],
    }
    two: tuple[Outcome, ...] = ("ok", "exhausted", "fail", *(("ok",) * 5))
    failing = Engine(_fan_out_case(two, Tolerance(percent=12.5)), random.Random(1))
    assert failing.run().status == "failed"
    settled = [f for f in failing.facts if isinstance(f, NodeSettled) and f.step == 1]
    assert [(f.status, f.error_type) for f in settled] == [("failed", "FanOutFailed")]
    skipped = [(f.step, f.reason) for f in failing.facts if isinstance(f, NodeSkipped)]
    assert skipped == [(2, "readiness_unsatisfied")]


@settings(max_examples=300, deadline=None)
@given(case=cases(), order=st.randoms(use_true_random=False), cancel_after=st.integers(0, 12))
def test_after_a_cancel_only_the_finally_steps_start_and_the_run_ends_cancelled(
    case: Case, order: random.Random, cancel_after: int
) -> None:
    """A cancel at a random moment (after some results): the steps running settle,
    nothing new starts but the finally steps that have not run, each runs once, and the
    run ends cancelled exactly once (or the cancel came too late and is refused)."""
    engine = Engine(case, order, cancel_after=cancel_after)
    final = engine.run()
    facts = engine.facts
    names = [n.name for n in case.nodes]
    terminal = [f for f in facts if isinstance(f, RunSucceeded | RunFailed | RunStopped)]
    assert len(terminal) == 1 and terminal[0] is facts[-1]
    ready = Counter(names[f.step] for f in facts if isinstance(f, NodeReady) and f.item is None)
    assert set(ready.values()) <= {1}, ready
    settled = Counter(names[f.step] for f in facts if isinstance(f, NodeSettled))
    guarded_out = {
        names[f.step]
        for f in facts
        if isinstance(f, NodeSkipped) and f.reason == "predicate_false" and names[f.step] in ready
    }
    assert settled == ready - Counter(guarded_out), (settled, ready)
    assert len({f.fact_key for f in facts}) == len(facts)
    requested = [i for i, f in enumerate(facts) if isinstance(f, RunStopRequested)]
    if engine.cancel_after is not None or engine.cancel_refusal is not None:
        # The run ended before the cancel was sent, or before it was decided.
        assert engine.cancel_refusal in (None, "run_terminal") and not requested
        assert final.status in ("succeeded", "failed")
        return
    assert len(requested) == 1
    after = facts[requested[0] :]
    started_after = [names[f.step] for f in after if isinstance(f, NodeReady)]
    assert all(case.nodes[names.index(n)].is_finally for n in started_after), started_after
    finals = [n.name for n in case.nodes if n.is_finally]
    assert all(ready[n] == 1 for n in finals), (finals, ready)  # each ran once
    assert isinstance(terminal[0], RunStopped) and terminal[0].execution == "Cancelled"
    assert final.status == "cancelled"
