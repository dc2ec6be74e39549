"""Every route of the JSON API over real HTTP against ``processor run``, bad input included."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from swagger_ui_bundle import swagger_ui_path

from processor.web.app import create_app
from processor.web.context import Readiness, WebContext
from tests.apps.support import wait_until
from tests.web.support import Served, assert_docs_offline, status_of, submit


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
    assert ready.json() == {
        "ready": True,
        "partitions": [0, 1, 2, 3],
        "quarantined": [],
        "skipped": [],
    }
    scraped = anyone.get("/metrics")
    assert scraped.headers["content-type"].startswith("text/plain")
    assert "processor_partitions_owned 4.0" in scraped.text
    spec = anyone.get("/openapi.json").json()
    routes = {
        ("get", "/api/runs"),
        ("post", "/api/runs"),
        ("get", "/api/runs/{run_id}"),
        ("get", "/api/runs/{run_id}/history"),
        ("get", "/api/runs/{run_id}/graph"),
        ("post", "/api/runs/{run_id}/cancel"),
        ("post", "/api/runs/{run_id}/redrive"),
        ("post", "/api/runs/{run_id}/release"),
        ("get", "/api/requests"),
        ("post", "/api/completions"),
        ("get", "/api/completions/{run_id}/{idempotency_key}"),
        ("get", "/api/rejected"),
        ("get", "/api/dlq"),
        ("get", "/healthz"),
        ("get", "/readyz"),
        ("get", "/metrics"),
        ("get", "/"),
    }
    for method, path in routes:
        assert spec["paths"][path][method]["summary"], (method, path)

    assert anyone.get("/docs").status_code == 200


def test_the_docs_page_loads_only_files_served_here(served: Served) -> None:
    assert_docs_offline(served.http(token=None).get)


def test_a_workers_docs_page_loads_only_files_served_here() -> None:
    worker_app = create_app(
        WebContext(bind_host="127.0.0.1", token=None, readiness=lambda: Readiness(True))
    )
    with TestClient(worker_app) as http:
        loaded = assert_docs_offline(http.get)
    assert "/openapi.json" in loaded


def test_the_docs_page_is_swagger_ui_5_which_renders_openapi_3_1() -> None:
    """FastAPI writes OpenAPI 3.1, which Swagger UI renders from version 5 on."""
    assert (
        TestClient(create_app(WebContext("127.0.0.1", None, lambda: Readiness(True))))
        .get("/openapi.json")
        .json()["openapi"]
        .startswith("3.1")
    )
    version = Path(str(swagger_ui_path)).name.removeprefix("swagger-ui-")
    assert int(version.split(".")[0]) >= 5, version


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


def test_a_traceparent_header_goes_with_the_run(served: Served) -> None:
    http = served.http()
    trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    body = {"pipeline": "orders", "input": {"order_id": "t-1", "amount": 1}}
    answer = http.post("/api/runs", json=body, headers={"traceparent": trace})
    assert answer.status_code == 201, answer.text
    run_id = answer.json()["run_id"]
    history = http.get(f"/api/runs/{run_id}/history").json()["facts"]
    submitted = next(fact for fact in history if fact["type"] == "RunSubmitted")
    assert submitted["traceparent"] == trace
    bad = http.post("/api/runs", json=body, headers={"traceparent": "00-not-a-trace"})
    assert "traceparent" in _error(bad, 422, "invalid_traceparent")


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
    assert first["partitions"] == list(range(served.deployment.topology.partitions))
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
    forged = {"Authorization": "Bearer caf\u00e9".encode("latin-1")}  # not ASCII: still a 401
    no_ascii = served.http(token=None).post(path, json=body, headers=forged)
    assert "wrong" in _error(no_ascii, 401, "unauthorized")


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
    assert status_of(http, failed)["retry_reason"] == "non_retryable"  # the run view says why
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


def test_release_refusals(served: Served) -> None:
    """A release of a run not in quarantine is refused (the release itself is tested
    with a planted bug: tests/control/test_quarantine.py)."""
    http = served.http()
    running = submit(http, "orders", {"order_id": "rl-1", "amount": 1})["run_id"]
    wait_until(lambda: http.get(f"/api/runs/{running}").status_code == 200, 60, "the run")
    assert status_of(http, running)["quarantine"] is None
    _error(http.post(f"/api/runs/{running}/release", json={"reason": "x"}), 409, "not_quarantined")
    _error(http.post("/api/runs/no-such-run/release"), 404, "unknown_run")
    _error(http.post(f"/api/runs/{running}/release", json={"what": 1}), 422, "invalid_request")
    _error(served.http(token=None).post(f"/api/runs/{running}/release"), 401, "unauthorized")


def test_history_pages_and_bad_input(served: Served) -> None:
    http = served.http(token=None)
    run_id = submit(served.http(), "non_retryable", {"h": 1})["run_id"]
    wait_until(lambda: status_of(http, run_id)["status"] == "failed", 60, "the run failed")
    whole = http.get(f"/api/runs/{run_id}/history", params={"limit": 1000}).json()
    assert whole["run_id"] == run_id and whole["next_after"] is None
    seqs = [fact["seq"] for fact in whole["facts"]]
    assert seqs == sorted(seqs) and len(seqs) >= 3
    assert whole["facts"][0]["type"] == "RunSubmitted"
    first = http.get(f"/api/runs/{run_id}/history", params={"limit": 2}).json()
    assert [f["seq"] for f in first["facts"]] == seqs[:2]
    assert first["next_after"] == seqs[1]
    rest = http.get(f"/api/runs/{run_id}/history", params={"after": first["next_after"]}).json()
    assert [f["seq"] for f in rest["facts"]] == seqs[2:]
    _error(http.get("/api/runs/no-such-run/history"), 404, "unknown_run")
    _error(http.get(f"/api/runs/{run_id}/history", params={"after": -1}), 422, "invalid_request")
    _error(http.get(f"/api/runs/{run_id}/history", params={"limit": 5000}), 422, "invalid_request")


def test_pending_requests_need_the_token_and_complete_a_run(served: Served) -> None:
    http = served.http()
    run_id = submit(http, "orders", {"order_id": "p-1", "amount": 2})["run_id"]

    def pending() -> list[dict[str, object]]:
        answer = http.get("/api/requests", params={"run": run_id})
        assert answer.status_code == 200, answer.text
        found: list[dict[str, object]] = answer.json()["requests"]
        return found

    requests = wait_until(pending, 60, "the run's pending request")
    assert len(requests) == 1
    request = requests[0]
    assert (request["run_id"], request["target"], request["kind"]) == (run_id, "payments", "await")
    assert set(request) == {
        "run_id",
        "boundary",
        "item_index",
        "kind",
        "target",
        "deadline_ms",
        "token",
        "partition",
    }
    by_target = http.get("/api/requests", params={"target": "payments"}).json()["requests"]
    assert run_id in {r["run_id"] for r in by_target}
    owned = list(range(served.deployment.topology.partitions))  # this processor alone
    none = {"requests": [], "partitions": owned}
    assert http.get("/api/requests", params={"target": "nobody"}).json() == none
    # It reveals tokens: the bearer token even on loopback.
    _error(served.http(token=None).get("/api/requests"), 401, "unauthorized")
    _error(served.http(token="wrong").get("/api/requests"), 401, "unauthorized")
    done = {
        "token": request["token"],
        "outcome": "succeeded",
        "output": {"order_id": "p-1", "amount": 2.4, "payment_id": "pay-p"},
    }
    assert http.post("/api/completions", json=done).status_code == 202
    wait_until(lambda: status_of(http, run_id)["status"] == "succeeded", 60, "the run done")
    wait_until(lambda: not pending(), 60, "no request pending any more")


def test_rejected_and_dead_letters_page_by_page(served: Served) -> None:
    http = served.http()
    failed = [submit(http, "non_retryable", {"d": i})["run_id"] for i in range(3)]
    for i in range(3):  # refused input, kept in admission.rejected
        answer = http.post("/api/runs", json={"pipeline": f"missing-{i}", "input": i})
        assert answer.status_code == 422

    def all_of(path: str, limit: int) -> list[dict[str, object]]:
        records, cursor = [], None
        while True:
            params = {"limit": limit} | ({"cursor": cursor} if cursor else {})
            page = http.get(path, params=params)
            assert page.status_code == 200, page.text
            body = page.json()
            assert len(body["records"]) <= limit
            records += body["records"]
            cursor = body["next_cursor"]
            if cursor is None:
                return records

    wait_until(
        lambda: set(failed) <= {r["run_id"] for r in all_of("/api/dlq", 2)}, 60, "dead letters"
    )
    reasons = [r["reason"] for r in all_of("/api/rejected", 2)]
    assert reasons.count("unknown_pipeline") >= 3
    _error(http.get("/api/dlq", params={"cursor": "garbage"}), 400, "bad_cursor")
    rejected_cursor = http.get("/api/rejected", params={"limit": 1}).json()["next_cursor"]
    _error(http.get("/api/dlq", params={"cursor": rejected_cursor}), 400, "bad_cursor")
    _error(http.get("/api/rejected", params={"limit": 0}), 422, "invalid_request")
