"""Every route of the JSON API over real HTTP against ``processor run``, bad input included."""

from __future__ import annotations

import httpx
import pytest

from tests.apps.support import wait_until
from tests.web.support import Served, status_of, submit


def _error(answer: httpx.Response, status: int, error: str) -> str:
    """Assert the error shape; return the detail."""
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert set(body) == {"error", "detail"}, body
    assert body["error"] == error, body
    assert "Traceback" not in answer.text
    detail: str = body["detail"]
    assert detail
    return detail


def test_health_ready_metrics_and_openapi(served: Served) -> None:
    anyone = served.http(token=None)
    assert anyone.get("/healthz").json() == {"status": "ok"}
    ready = anyone.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"ready": True, "partitions": [0, 1, 2, 3]}
    scraped = anyone.get("/metrics")
    assert scraped.headers["content-type"].startswith("text/plain")
    assert "processor_partitions_owned 4.0" in scraped.text
    spec = anyone.get("/openapi.json").json()
    for path in (
        "/api/runs",
        "/api/runs/{run_id}",
        "/api/runs/{run_id}/cancel",
        "/api/completions",
    ):
        assert path in spec["paths"], sorted(spec["paths"])
    assert anyone.get("/docs").status_code == 200


def test_submit_created_then_existing_with_the_idempotency_key(served: Served) -> None:
    http = served.http()
    body = {
        "pipeline": "orders",
        "input": {"order_id": "k-1", "amount": 2},
        "idempotency_key": "k-1",
    }
    first = http.post("/api/runs", json=body)
    assert first.status_code == 201, first.text
    assert first.json()["created"] is True
    again = http.post("/api/runs", json=body)
    assert again.status_code == 200, again.text
    assert again.json() == {"run_id": first.json()["run_id"], "created": False}


def test_a_refused_submit_is_422_with_the_reason(served: Served) -> None:
    answer = served.http().post("/api/runs", json={"pipeline": "no-such", "input": 1})
    assert "no-such" in _error(answer, 422, "unknown_pipeline")


def test_one_run_and_an_unknown_run(served: Served) -> None:
    http = served.http(token=None)  # a GET that reveals no token is open on loopback
    run_id = submit(served.http(), "orders", {"order_id": "s-1", "amount": 1})["run_id"]
    shown = wait_until(
        lambda: (s := status_of(http, run_id))["phase"] == "suspended" and s, 60, "a suspended run"
    )
    assert shown["pipeline"] == "orders"
    assert shown["waiting"]["open"] == 1
    assert "no-such-run" in _error(http.get("/api/runs/no-such-run"), 404, "unknown_run")


def test_list_runs_filters_and_pages(served: Served) -> None:
    http = served.http()
    made = [submit(http, "orders", {"order_id": f"l-{i}", "amount": 1})["run_id"] for i in range(3)]
    failed = submit(http, "non_retryable", {"x": 1})["run_id"]

    def listed(**query: object) -> list[str]:
        answer = http.get("/api/runs", params=query)
        assert answer.status_code == 200, answer.text
        return [r["run_id"] for r in answer.json()["runs"]]

    wait_until(lambda: set(made) <= set(listed(target="payments")), 60, "runs waiting on payments")
    wait_until(lambda: failed in listed(status="failed"), 60, "the failed run listed")
    assert failed not in listed(pipeline="orders")
    assert set(made) <= set(listed(pipeline="orders", status="running"))
    first = http.get("/api/runs", params={"limit": 2}).json()
    assert len(first["runs"]) == 2 and first["next_cursor"]
    second = http.get("/api/runs", params={"limit": 2, "cursor": first["next_cursor"]}).json()
    assert not {r["run_id"] for r in first["runs"]} & {r["run_id"] for r in second["runs"]}
    newest = first["runs"][0]
    assert set(newest) == {
        "run_id",
        "pipeline",
        "pipeline_version",
        "status",
        "phase",
        "submitted_ms",
        "updated_ms",
        "waiting_on",
        "partition",
    }
    later = listed(since=newest["submitted_ms"] + 1)
    assert newest["run_id"] not in later


@pytest.mark.parametrize(
    ("query", "status", "error"),
    [
        ({"cursor": "not-a-cursor"}, 400, "bad_cursor"),
        ({"limit": 0}, 422, "invalid_request"),
        ({"limit": 1001}, 422, "invalid_request"),
        ({"limit": "many"}, 422, "invalid_request"),
        ({"since": -1}, 422, "invalid_request"),
        ({"status": "sleeping"}, 400, "bad_query"),
    ],
)
def test_bad_listing_queries(
    served: Served, query: dict[str, object], status: int, error: str
) -> None:
    _error(served.http().get("/api/runs", params=query), status, error)


def test_a_cursor_of_another_listing_is_refused(served: Served) -> None:
    http = served.http()
    for i in range(2):
        submit(http, "orders", {"order_id": f"c-{i}", "amount": 1})
    page = http.get("/api/runs", params={"limit": 1}).json()
    answer = http.get(
        "/api/runs", params={"limit": 1, "status": "failed", "cursor": page["next_cursor"]}
    )
    assert "other filters" in _error(answer, 400, "bad_cursor")


def test_cancel_then_cancel_again(served: Served) -> None:
    http = served.http()
    run_id = submit(http, "orders", {"order_id": "x-1", "amount": 1})["run_id"]
    answer = http.post(f"/api/runs/{run_id}/cancel", json={"reason": "changed my mind"})
    assert answer.status_code == 202, answer.text
    assert answer.json()["accepted"] is True
    wait_until(lambda: status_of(http, run_id)["status"] == "cancelled", 60, "the run cancelled")
    assert status_of(http, run_id)["stop_detail"] == "changed my mind"
    _error(http.post(f"/api/runs/{run_id}/cancel"), 409, "run_terminal")
    _error(http.post("/api/runs/no-such-run/cancel", json={}), 404, "unknown_run")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/runs", {"pipeline": "orders", "input": {}}),
        ("/api/runs/r-1/cancel", {}),
        ("/api/completions", {"token": "t", "outcome": "succeeded"}),
    ],
)
def test_every_post_needs_the_bearer_token(
    served: Served, path: str, body: dict[str, object]
) -> None:
    missing = _error(served.http(token=None).post(path, json=body), 401, "unauthorized")
    assert "missing" in missing
    wrong = _error(served.http(token="wrong").post(path, json=body), 401, "unauthorized")
    assert "wrong" in wrong


def test_bad_bodies(served: Served) -> None:
    http = served.http()
    bad = http.post(
        "/api/runs",
        content=b'{"pipeline": "orders", ',
        headers={"content-type": "application/json"},
    )
    _error(bad, 400, "malformed_json")
    _error(http.post("/api/runs", json={"input": 1}), 422, "invalid_request")
    _error(
        http.post("/api/runs", json={"pipeline": "orders", "input": 1, "extra": 2}),
        422,
        "invalid_request",
    )
    _error(
        http.post("/api/runs", json={"pipeline": "orders", "input": 1, "deadline_s": -1}),
        422,
        "invalid_request",
    )
    _error(http.post("/api/runs", content=b"pipeline=orders"), 415, "unsupported_media_type")
    _error(
        http.post("/api/completions", json={"token": "not a token", "outcome": "succeeded"}),
        422,
        "invalid_token",
    )
    _error(
        http.post("/api/completions", json={"token": "t", "outcome": "maybe"}),
        422,
        "invalid_request",
    )


def test_unknown_routes_and_methods(served: Served) -> None:
    http = served.http()
    _error(http.get("/api/nothing-here"), 404, "not_found")
    _error(http.delete("/api/runs"), 405, "method_not_allowed")


def test_redrive_a_failed_run_and_refusals(served: Served) -> None:
    http = served.http()
    failed = submit(http, "non_retryable", {"r": 1})["run_id"]
    wait_until(lambda: status_of(http, failed)["status"] == "failed", 60, "the run failed")
    answer = http.post(f"/api/runs/{failed}/redrive", json={})
    assert answer.status_code == 202, answer.text
    assert answer.json()["accepted"] is True

    def failed_again() -> dict[str, object]:
        shown = status_of(http, failed)
        return shown if shown["status"] == "failed" and shown.get("redrives") == 1 else {}

    wait_until(failed_again, 60, "the redriven run to fail again")
    running = submit(http, "orders", {"order_id": "rd-1", "amount": 1})["run_id"]
    _error(http.post(f"/api/runs/{running}/redrive"), 409, "not_failed")
    _error(http.post("/api/runs/no-such-run/redrive", json={}), 404, "unknown_run")
    _error(http.post(f"/api/runs/{failed}/redrive", json={"from_step": -1}), 422, "invalid_request")
    _error(served.http(token=None).post(f"/api/runs/{failed}/redrive"), 401, "unauthorized")
