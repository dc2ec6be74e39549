"""What a graph run of the kill -9 workloads must show in its journal, from its input.

The workloads (``tests/faults/test_crash_graphs.py`` on the embedded log,
``tests/kafka/test_crash_graphs.py`` on a broker) submit runs of
``tests.apps.graph_pipelines``'s ``mixed``, ``routes``, ``fanned`` and ``answered``
pipelines (``random_run``), and check every run's journal against its story
(``assert_each_run_once``): it ended exactly once, as its input implies, with its result;
no step's result was admitted twice (one ``NodeReady``, ``NodeSettled`` and
``StepCompleted`` per step that ran); a route not taken never ran and was skipped once;
each caught run decided its catch once; each fan-out item started and settled at most
once (every item, when the tolerance held), never more than ``FAN_LIMIT`` open at once;
each await's interaction was admitted exactly once; no fact key repeats; sequence
numbers are gapless.
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from processor.facts.models import (
    BoundaryCompletionAdmitted,
    BoundaryRequest,
    CatchDecided,
    FactHeader,
    FanOutItemSettled,
    NodeReady,
    NodeSettled,
    NodeSkipped,
    RouteDecided,
    RunFailed,
    RunStopped,
    RunSucceeded,
    StepCompleted,
)
from tests.apps.graph_pipelines import (
    FAN_LIMIT,
    answered,
    expected_answered_result,
    expected_fanned_result,
    expected_mixed_result,
    fanned,
    mixed,
    routes,
)

__all__ = [
    "PIPELINES",
    "TERMINAL",
    "Submitted",
    "answer",
    "approval",
    "assert_each_run_once",
    "random_run",
    "story",
]

TERMINAL = (RunSucceeded, RunFailed, RunStopped)
PIPELINES = (mixed, routes, fanned, answered)
STEPS = {p.name: [step.spec.name for step in p.steps] for p in PIPELINES}
Submitted = tuple[str, dict[str, Any]]  # the pipeline and the input of a run


def answer(request: BoundaryRequest, value: Any) -> dict[str, int]:
    """The external system's answer to an ``answered`` run's await."""
    return approval(value)


def approval(value: dict[str, Any]) -> dict[str, int]:
    """What the answer to an await requesting ``value`` is: a function of it, checkable."""
    return {"approved": int(value["n"]) * 3 + 1}


def random_run(rng: random.Random, n: int, fan_sizes: tuple[int, int] = (20, 50)) -> Submitted:
    """The ``n``-th run of a workload: a ``routes`` run (choosing a route, the other, or
    one it did not declare), a ``fanned`` run (of ``fan_sizes`` items, some failing,
    sometimes more than tolerated), an ``answered`` run or a ``mixed`` run."""
    kind = rng.random()
    if kind < 0.15:
        choice = rng.choice(["refund", "reship", "lose"])
        return ("routes", {"choose": choice, "amount": n})
    if kind < 0.25:
        size, bad = rng.randint(*fan_sizes), rng.choice([0, 1, 3, 4, 6])
        bad_items = set(rng.sample(range(size), bad))
        items = [
            {"i": i, "bad": i in bad_items, "nap_ms": rng.choice([0, 0, 5])} for i in range(size)
        ]
        return ("fanned", {"items": items})
    if kind < 0.4:
        return ("answered", {"n": n, "nap_ms": rng.choice([0, 5, 20])})
    breaks = rng.random() < 0.3
    return ("mixed", {"n": n, "break": breaks, "nap_ms": rng.choice([0, 5, 20])})


def assert_each_run_once(facts: list[FactHeader], inputs: dict[str, Submitted]) -> None:
    """Every run of ``inputs`` (run id -> its pipeline and input), and no other, shows
    its story in ``facts`` (the whole journal), ending exactly once."""
    by_run: dict[str, list[FactHeader]] = defaultdict(list)
    for fact in facts:
        by_run[fact.run_id].append(fact)
    assert by_run.keys() == inputs.keys(), "facts of unknown runs, or runs without facts"
    keys = Counter((f.run_id, f.fact_key) for f in facts)
    assert [key for key, count in keys.items() if count > 1] == [], "fact keys appended twice"
    for run_id, run in by_run.items():
        assert [f.seq for f in run] == list(range(1, len(run) + 1)), run_id
        terminal = [f for f in run if isinstance(f, TERMINAL)]
        assert len(terminal) == 1 and terminal[0] is run[-1], (run_id, terminal)
        pipeline, value = inputs[run_id]
        _assert_story(run_id, run, STEPS[pipeline], story(pipeline, value))
        if pipeline == "fanned":
            _assert_items_once(run_id, run, value)
        admitted = [f for f in run if isinstance(f, BoundaryCompletionAdmitted)]
        assert len(admitted) == (1 if pipeline == "answered" else 0), (run_id, admitted)


def _assert_items_once(run_id: str, run: list[FactHeader], value: dict[str, Any]) -> None:
    """Each item started and settled once, lowest index first, never more than
    ``FAN_LIMIT`` open at once; every item when the tolerance held."""
    size = len(value["items"])
    started = [f.item for f in run if isinstance(f, NodeReady) and f.item is not None]
    settled = Counter(f.item for f in run if isinstance(f, FanOutItemSettled))
    assert started == list(range(len(started))), (run_id, started)
    assert settled == Counter(started), (run_id, settled)
    if expected_fanned_result(value) is not None:
        assert len(started) == size, (run_id, len(started), size)
    open_items, most = 0, 0
    for fact in run:
        if isinstance(fact, NodeReady) and fact.item is not None:
            open_items += 1
            most = max(most, open_items)
        elif isinstance(fact, FanOutItemSettled):
            open_items -= 1
    assert most == min(FAN_LIMIT, size), (run_id, most)


@dataclass(frozen=True)
class Story:
    """What a run's journal must show, from its input."""

    result: Any  # None: the run fails
    ran: set[str]
    failed: set[str]  # of ``ran``: settled failed, no StepCompleted
    skipped: list[tuple[str, str]]
    routes: list[tuple[str, ...]]
    caught: list[tuple[str, str]]


def story(pipeline: str, value: dict[str, Any]) -> Story:
    stories = {
        "mixed": _mixed_story,
        "routes": _routes_story,
        "fanned": _fanned_story,
        "answered": _answered_story,
    }
    return stories[pipeline](value)


def _fanned_story(value: dict[str, Any]) -> Story:
    result = expected_fanned_result(value)
    if result is None:  # beyond the tolerance: the fan-out fails, count never runs
        skipped = [("count", "readiness_unsatisfied")]
        return Story(None, {"listing", "each"}, {"each"}, skipped, [], [])
    return Story(result, {"listing", "each", "count"}, set(), [], [], [])


def _answered_story(value: dict[str, Any]) -> Story:
    result = expected_answered_result(value, approval(value))
    ran = {"ask", "approve", "compute", "conclude", "wrap"}
    return Story(result, ran, set(), [], [], [])


def _mixed_story(value: dict[str, Any]) -> Story:
    taken = "even" if value["n"] * 2 % 4 == 0 else "odd"
    not_taken = "odd" if taken == "even" else "even"
    ran = {"start", "left", "right", "pick", taken, "merge", "tidy"}
    skipped = [(not_taken, "predicate_false")]
    if value["break"]:
        return Story(
            expected_mixed_result(value),
            ran | {"patch"},
            {"right"},
            skipped,
            [(taken,)],
            [("right", "patch")],
        )
    skipped.append(("patch", "readiness_unsatisfied"))
    return Story(expected_mixed_result(value), ran, set(), skipped, [(taken,)], [])


def _routes_story(value: dict[str, Any]) -> Story:
    choice = value["choose"]
    if choice == "lose":  # the switch fails; close (none_failed) and audit still run
        skipped = [("refund", "readiness_unsatisfied"), ("reship", "readiness_unsatisfied")]
        return Story(None, {"triage", "close", "audit"}, {"triage"}, skipped, [], [])
    other = "reship" if choice == "refund" else "refund"
    done = {"refund": "refunded", "reship": "reshipped"}[choice]
    result = {choice: {done: value["amount"]}, other: None}
    ran = {"triage", choice, "close", "audit"}
    return Story(result, ran, set(), [(other, "predicate_false")], [(choice,)], [])


def _assert_story(run_id: str, run: list[FactHeader], steps: list[str], expected: Story) -> None:
    if expected.result is None:
        assert isinstance(run[-1], RunFailed), (run_id, run[-1])
    else:
        assert isinstance(run[-1], RunSucceeded), (run_id, run[-1])
        assert json.loads(run[-1].result) == expected.result, run_id

    def named(kind: type[Any]) -> Counter[str]:
        """Steps of facts of ``kind``, not counting a fan-out's items'."""
        return Counter(
            steps[f.step] for f in run if isinstance(f, kind) and getattr(f, "item", None) is None
        )

    once = Counter(dict.fromkeys(expected.ran, 1))
    assert named(NodeReady) == once, (run_id, named(NodeReady))
    assert named(NodeSettled) == once, (run_id, named(NodeSettled))
    completed = Counter(dict.fromkeys(expected.ran - expected.failed, 1))
    assert named(StepCompleted) == completed, (run_id, named(StepCompleted))
    skipped = [(steps[f.step], f.reason) for f in run if isinstance(f, NodeSkipped)]
    assert sorted(skipped) == sorted(expected.skipped), (run_id, skipped)
    assert [f.routes for f in run if isinstance(f, RouteDecided)] == expected.routes, run_id
    caught = [(steps[f.step], steps[f.handler]) for f in run if isinstance(f, CatchDecided)]
    assert caught == expected.caught, run_id
