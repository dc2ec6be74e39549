"""``GET /api/runs/{run_id}/graph?at_seq=`` over real HTTP against ``processor run``: a
graph run with parallel branches, a caught failure and a skipped route, as of its last
fact and of earlier ones (time travel); a chain as a line graph; and the refusals."""

from __future__ import annotations

from typing import Any

import httpx

from processor.model.graph_view import NODE_STATES
from processor.testing import LocalEnvironment
from processor.web.context import Readiness, WebContext
from processor.web.errors import ApiError
from processor.web.run_graph import run_graph
from tests.apps.support import wait_until
from tests.apps.web_pipelines import app, fulfil
from tests.web.support import Served, status_of, submit

FULFIL_STEPS = [
    "begin",
    "charge",
    "reserve",
    "backorder",
    "choose",
    "ship",
    "pickup",
    "lines",
    "price",
    "confirm",
    "release",
]


def _error(answer: httpx.Response, status: int, error: str) -> str:
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert set(body) == {"error", "detail"} and body["error"] == error, body
    detail: str = body["detail"]
    return detail


def _graph(http: httpx.Client, run_id: str, **params: Any) -> dict[str, Any]:
    answer = http.get(f"/api/runs/{run_id}/graph", params=params)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def _states(graph: dict[str, Any]) -> dict[str, str]:
    return {node["name"]: node["state"] for node in graph["nodes"]}


def _history(http: httpx.Client, run_id: str) -> list[dict[str, Any]]:
    facts: list[dict[str, Any]] = http.get(
        f"/api/runs/{run_id}/history", params={"limit": 1000}
    ).json()["facts"]
    return facts


def _finished(served: Served, value: dict[str, Any]) -> str:
    http = served.http(token=None)
    run_id: str = submit(served.http(), "fulfil", value)["run_id"]
    wait_until(lambda: status_of(http, run_id)["status"] != "running", 60, "the run to end")
    return run_id


def test_a_graph_run_as_of_its_last_fact(served: Served) -> None:
    http = served.http(token=None)
    run_id = _finished(served, {"out_of_stock": True, "pickup": True, "total": 5})
    graph = _graph(http, run_id)
    facts = _history(http, run_id)
    assert graph["run_id"] == run_id
    assert (graph["pipeline"], graph["pipeline_version"], graph["shape"]) == ("fulfil", 1, "graph")
    assert graph["status"] == "succeeded"
    assert graph["seq"] == graph["last_seq"] == facts[-1]["seq"]
    assert graph["fact"]["type"] == "RunSucceeded"
    assert [n["name"] for n in graph["nodes"]] == FULFIL_STEPS
    assert _states(graph) == {
        "begin": "succeeded",
        "charge": "succeeded",
        "reserve": "caught",
        "backorder": "succeeded",
        "choose": "succeeded",
        "ship": "skipped",
        "pickup": "succeeded",
        "lines": "succeeded",
        "price": "succeeded",
        "confirm": "succeeded",
        "release": "succeeded",
    }
    nodes = {n["name"]: n for n in graph["nodes"]}
    # A fan-out over three lines, one of them a tolerated failure.
    assert nodes["price"]["kind"] == "fan_out"
    assert nodes["price"]["fan_out"]["max_in_flight"] == 2
    assert nodes["price"]["progress"] == {"done": 2, "in_flight": 0, "failed": 1, "total": 3}
    assert nodes["reserve"]["error"] == "no stock left"
    assert nodes["reserve"]["catch"] == "backorder"
    assert nodes["ship"]["reason"] == "predicate_false"
    assert nodes["choose"]["routes"] == ["ship", "pickup"]
    assert nodes["choose"]["routes_taken"] == ["pickup"]
    assert nodes["release"]["finally"] is True
    assert {n["depth"] for n in (nodes["charge"], nodes["reserve"])} == {1}  # side by side
    edges = {(e["from"], e["to"]): e for e in graph["edges"]}
    assert edges["choose", "pickup"] == {
        "from": "choose",
        "to": "pickup",
        "kind": "route",
        "taken": True,
    }
    assert edges["choose", "ship"]["taken"] is False
    assert edges["reserve", "backorder"] == {
        "from": "reserve",
        "to": "backorder",
        "kind": "catch",
        "taken": True,
    }
    assert {n["state"] for n in graph["nodes"]} <= set(NODE_STATES)


def test_at_seq_shows_the_graph_as_it_was_after_that_fact(served: Served) -> None:
    http = served.http(token=None)
    run_id = _finished(served, {"out_of_stock": True, "pickup": True})
    facts = _history(http, run_id)

    def seq_of(kind: str, step: int | None = None) -> int:
        return next(
            f["seq"] for f in facts if f["type"] == kind and (step is None or f["step"] == step)
        )

    first = _graph(http, run_id, at_seq=1)
    assert first["seq"] == 1 and first["fact"]["type"] == "RunSubmitted"
    assert first["status"] == "running"
    assert set(_states(first).values()) == {"pending"}

    # reserve failed (settled) and its catch not yet decided; charge ran beside it.
    failed = _graph(http, run_id, at_seq=seq_of("CatchDecided") - 1)
    states = _states(failed)
    assert states["reserve"] == "failed"
    assert states["backorder"] == "pending"
    assert states["choose"] == "pending"
    caught = _states(_graph(http, run_id, at_seq=seq_of("CatchDecided")))
    assert caught["reserve"] == "caught"

    # Before the switch chose, both routes were pending; after, one is skipped.
    route = seq_of("RouteDecided")
    before = _graph(http, run_id, at_seq=route - 1)
    assert (_states(before)["ship"], _states(before)["pickup"]) == ("pending", "pending")
    assert {e["taken"] for e in before["edges"] if e["kind"] == "route"} == {None}
    after = _graph(http, run_id, at_seq=seq_of("NodeSkipped"))
    assert _states(after)["ship"] == "skipped"
    assert after["nodes"][5]["reason"] == "predicate_false"

    # A step between its NodeReady and its result is in flight.
    ready = seq_of("NodeReady", step=1)
    assert _states(_graph(http, run_id, at_seq=ready))["charge"] == "running"

    # The fan-out once its second item started: two in flight, at most two at once.
    price = FULFIL_STEPS.index("price")
    second = next(f["seq"] for f in facts if f["type"] == "NodeReady" and f.get("item") == 1)
    shown = {n["name"]: n for n in _graph(http, run_id, at_seq=second)["nodes"]}["price"]
    assert shown["state"] == "running"
    assert shown["progress"] == {"done": 0, "in_flight": 2, "failed": 0, "total": 3}
    assert shown["index"] == price


def test_a_chain_is_a_line_graph_waiting_at_its_await(served: Served) -> None:
    http = served.http(token=None)
    run_id = submit(served.http(), "orders", {"order_id": "g-1", "amount": 3})["run_id"]
    wait_until(lambda: status_of(http, run_id)["phase"] == "suspended", 60, "a suspended run")
    graph = _graph(http, run_id)
    assert graph["shape"] == "chain"
    names = [n["name"] for n in graph["nodes"]]
    assert [n["needs"] for n in graph["nodes"]] == [[], *[[name] for name in names[:-1]]]
    assert [n["kind"] for n in graph["nodes"]] == ["step", "step", "await", "step"]
    assert [n["state"] for n in graph["nodes"]] == ["succeeded", "succeeded", "waiting", "pending"]
    assert graph["nodes"][2]["phase"] == "suspended"
    assert _states(_graph(http, run_id, at_seq=1)) == dict.fromkeys(names, "pending")


def test_a_failed_graph_run_shows_the_failure_and_what_it_skipped(served: Served) -> None:
    http = served.http(token=None)
    run_id = _finished(served, {"declined": True})
    graph = _graph(http, run_id)
    assert graph["status"] == "failed"
    nodes = {n["name"]: n for n in graph["nodes"]}
    assert nodes["charge"]["state"] == "failed"
    assert (nodes["charge"]["error"], nodes["charge"]["error_type"]) == (
        "card declined",
        "NonRetryableError",
    )
    assert nodes["choose"]["state"] == "skipped"
    assert nodes["choose"]["reason"] == "readiness_unsatisfied"
    assert nodes["release"]["state"] == "succeeded"  # finally runs whatever the outcome


def test_refusals(served: Served) -> None:
    http = served.http(token=None)
    run_id = _finished(served, {})
    last = _graph(http, run_id)["last_seq"]
    assert "no-such-run" in _error(http.get("/api/runs/no-such-run/graph"), 404, "unknown_run")
    for bad in (0, -3, last + 1):
        detail = _error(
            http.get(f"/api/runs/{run_id}/graph", params={"at_seq": bad}), 400, "bad_seq"
        )
        assert f"1 to {last}" in detail and str(bad) in detail
    detail = _error(
        http.get(f"/api/runs/{run_id}/graph", params={"at_seq": "x"}), 422, "invalid_request"
    )
    assert "at_seq" in detail


def test_a_pipeline_version_not_loaded_is_refused() -> None:
    with LocalEnvironment(app) as env:
        run_id = env.submit("fulfil", {})
        env.wait(run_id)
        facts = env.history(run_id)
    context = WebContext(bind_host="127.0.0.1", token=None, readiness=lambda: Readiness(True))
    try:
        run_graph(context, run_id, facts, None)
    except ApiError as refused:
        assert (refused.status, refused.error) == (409, "pipeline_not_loaded")
        assert "'fulfil' v1" in refused.detail
    else:
        raise AssertionError("a run of a pipeline not loaded got a graph")
    loaded = WebContext(
        bind_host="127.0.0.1",
        token=None,
        readiness=lambda: Readiness(True),
        pipelines=lambda name, version: fulfil.spec() if (name, version) == ("fulfil", 1) else None,
    )
    assert run_graph(loaded, run_id, facts, None)["status"] == "succeeded"
