"""The graph view of real runs' histories (``processor/model/graph_view.py``), folded
fact by fact as ``/api/runs/{id}/graph?at_seq=`` folds them: a chain's unwind, and a
graph run cancelled while a branch runs."""

from __future__ import annotations

import threading
from typing import Any

from processor import LocalEnvironment
from processor.facts.models import AttemptStepStarted, FactHeader
from processor.model.graph_view import compensated_steps, graph_view
from processor.model.pipeline_spec import PipelineSpec
from processor.model.reduce import fold
from processor.worker.pipeline import Application, Pipeline
from tests.apps.control_pipelines import app as control_app
from tests.apps.control_pipelines import booking


def _after_each_fact(spec: PipelineSpec, facts: list[FactHeader]) -> list[dict[str, str]]:
    """The node states after each fact, as the graph route shows them for each at_seq."""
    shown = []
    for end in range(1, len(facts) + 1):
        prefix = facts[:end]
        state = fold(prefix)
        assert state is not None
        view = graph_view(spec, state, compensated_steps(prefix))
        shown.append({node.name: node.state for node in view.nodes})
    return shown


def _changes(shown: list[dict[str, str]]) -> list[dict[str, str]]:
    """The distinct states in order (a fact that changes nothing shows nothing new)."""
    return [s for i, s in enumerate(shown) if i == 0 or s != shown[i - 1]]


def test_a_chain_runs_fails_and_unwinds_step_by_step() -> None:
    with LocalEnvironment(control_app) as env:
        run_id = env.submit("booking", {"id": "view-1", "reject": True})
        assert env.wait(run_id).status == "failed"
        facts = env.history(run_id)
    changes = _changes(_after_each_fact(booking.spec(), facts))
    steps = list(changes[0])
    assert steps == ["reserve", "charge", "notify", "confirm"]

    def row(*states: str) -> dict[str, str]:
        return dict(zip(steps, states, strict=True))

    assert changes == [
        row("pending", "pending", "pending", "pending"),
        row("running", "pending", "pending", "pending"),
        row("succeeded", "running", "pending", "pending"),
        row("succeeded", "succeeded", "running", "pending"),
        row("succeeded", "succeeded", "succeeded", "running"),
        row("succeeded", "succeeded", "succeeded", "failed"),
        # The unwind, in reverse order of completion (notify has no compensator).
        row("succeeded", "compensating", "succeeded", "failed"),
        row("succeeded", "compensated", "succeeded", "failed"),
        row("compensating", "compensated", "succeeded", "failed"),
        row("compensated", "compensated", "succeeded", "failed"),
    ]


_gate = threading.Event()
held = Pipeline("held")


@held.step()
def start(value: Any) -> Any:
    return value


@held.step(needs=["start"])
def hold(value: Any) -> Any:
    _gate.wait(10)  # until the test has cancelled the run
    return value


@held.step(needs=["start"])
def quick(value: Any) -> Any:
    return value


@held.step(needs=["hold", "quick"])
def join(outputs: Any) -> Any:
    return outputs


@held.finally_step()
def tidy(value: Any) -> str:
    return "tidied"


def test_a_cancelled_graph_run_shows_what_never_ran() -> None:
    _gate.clear()
    with LocalEnvironment(Application([held])) as env:
        run_id = env.submit("held", {})
        env.wait_fact(run_id, AttemptStepStarted, count=3)  # start, quick, hold started
        env.client.cancel(run_id, reason="changed my mind")
        _gate.set()
        assert env.wait(run_id).status == "cancelled"
        facts = env.history(run_id)
    shown = _after_each_fact(held.spec(), facts)
    assert shown[-1] == {
        "start": "succeeded",
        "hold": "succeeded",  # a stop lets a running step settle
        "quick": "succeeded",
        "join": "not_run",
        "tidy": "succeeded",  # finally runs after a cancel
    }
    assert any(s["hold"] == "running" and s["quick"] == "succeeded" for s in shown)
    assert all(s["join"] == "pending" for s in shown[:-1])
