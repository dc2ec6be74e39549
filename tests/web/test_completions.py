"""A completion POSTed over HTTP goes through admission like any external system's."""

from __future__ import annotations

from tests.apps.support import wait_until
from tests.web.support import Served, request_of, status_of, submit


def _forged(token: str) -> str:
    """The same claims with another signature: parseable, but not the processor's."""
    body, _, mac = token.rpartition(".")
    return f"{body}.{'A' * len(mac)}"


def test_a_posted_completion_continues_the_run_twice_is_a_no_op_forged_is_refused(
    served: Served,
) -> None:
    http = served.http()
    run_id = submit(http, "orders", {"order_id": "c-1", "amount": 5})["run_id"]
    request = wait_until(lambda: request_of(served.deployment, run_id), 60, "the payment request")
    completion = {
        "token": request.resume_token,
        "outcome": "succeeded",
        "output": {"order_id": "c-1", "amount": 6.0, "payment_id": "pay-1"},
    }
    answer = http.post("/api/completions", json=completion)
    assert answer.status_code == 202, answer.text
    assert answer.json() == {"queued": True}
    done = wait_until(
        lambda: (s := status_of(http, run_id))["status"] == "succeeded" and s, 60, "the run done"
    )
    assert done["result"] == {
        "order_id": "c-1",
        "total": 6.0,
        "payment_id": "pay-1",
        "status": "invoiced",
    }

    assert http.post("/api/completions", json=completion).status_code == 202  # the same again
    forged = {**completion, "token": _forged(request.resume_token)}
    assert http.post("/api/completions", json=forged).status_code == 202  # admission decides

    def refused() -> list[dict[str, object]]:
        records, cursor = [], None
        while True:
            page = http.get("/api/rejected", params={"cursor": cursor} if cursor else {}).json()
            records += [r for r in page["records"] if r["run_id"] == run_id]
            if (cursor := page["next_cursor"]) is None:
                return records

    # Same run, same partition, in order: once the forged one is refused, the duplicate
    # before it has been handled too.
    rows = wait_until(refused, 60, "the forged completion in admission.rejected")
    assert len(rows) == 1, rows
    assert "token" in str(rows[0]["reason"]), rows
    after = status_of(http, run_id)
    assert after["version"] == done["version"]  # the duplicate changed nothing
    assert after["status"] == "succeeded"


def test_a_failed_completion_fails_the_run(served: Served) -> None:
    http = served.http()
    run_id = submit(http, "orders", {"order_id": "c-2", "amount": 5})["run_id"]
    request = wait_until(lambda: request_of(served.deployment, run_id), 60, "the payment request")
    failed = {"token": request.resume_token, "outcome": "failed", "error": "card declined"}
    assert http.post("/api/completions", json=failed).status_code == 202
    done = wait_until(
        lambda: (s := status_of(http, run_id))["status"] == "failed" and s, 60, "the run failed"
    )
    assert "card declined" in str(done["error"])
    missing = http.post("/api/completions", json={**failed, "error": None})
    assert missing.status_code == 422
    assert missing.json()["error"] == "invalid_request"
