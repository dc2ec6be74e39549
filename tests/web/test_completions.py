"""A completion POSTed over HTTP, or sent with ``processor complete``, goes through
admission like any external system's; with a wait, the sender learns what became
of it (admitted, a duplicate, refused with the reason, or still queued)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from processor.clients.external import CompletionClient
from processor.facts import payload, tokens
from processor.facts.keyring import KeyRing
from tests.apps.support import cli, wait_until
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
    assert (answer.json()["queued"], answer.json()["admission"]) == (True, "queued")
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


def _order_waiting(served: Served, order_id: str) -> tuple[str, str]:
    """A run of ``orders`` waiting for its payment: its id and resume token."""
    run_id = submit(served.http(), "orders", {"order_id": order_id, "amount": 5})["run_id"]
    request = wait_until(lambda: request_of(served.deployment, run_id), 60, "the payment request")
    return run_id, request.resume_token


def test_a_completion_posted_with_a_wait_answers_what_admission_decided(served: Served) -> None:
    http = served.http()
    run_id, token = _order_waiting(served, "w-1")
    output = {"order_id": "w-1", "amount": 6.0, "payment_id": "pay-w"}
    completion = {"token": token, "outcome": "succeeded", "output": output}

    first = http.post("/api/completions", params={"wait_s": 30}, json=completion)
    assert first.status_code == 200, first.text
    body = first.json()
    assert (body["admission"], body["queued"], body["run_id"]) == ("admitted", False, run_id)
    assert isinstance(body["partition"], int) and isinstance(body["offset"], int)

    again = http.post("/api/completions", params={"wait_s": 30}, json=completion)
    assert again.status_code == 200, again.text
    assert again.json()["admission"] == "duplicate"
    assert again.json()["offset"] > body["offset"]

    other = {**completion, "output": {**output, "payment_id": "pay-other"}}
    conflict = http.post("/api/completions", params={"wait_s": 30}, json=other)
    assert conflict.status_code == 409, conflict.text
    assert conflict.json()["error"] == "conflicting_completion"

    forged = {**completion, "token": _forged(token)}
    refused = http.post("/api/completions", params={"wait_s": 30}, json=forged)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"] == "invalid_token"
    assert "forged" in refused.json()["detail"]

    too_long = http.post("/api/completions", params={"wait_s": 61}, json=completion)
    assert too_long.status_code == 422 and too_long.json()["error"] == "invalid_request"


def _processor(served: Served, *args: str) -> subprocess.CompletedProcess[str]:
    """``processor ARGS`` against the served processor's log."""
    data_dir = served.process.data_dir
    return subprocess.run(
        [sys.executable, "-m", "processor", "--data-dir", str(data_dir), *args],
        env=served.cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_cli_complete_waits_for_what_admission_decided(served: Served) -> None:
    run_id, token = _order_waiting(served, "cli-w-1")
    answer = json.dumps({"order_id": "cli-w-1", "amount": 6.0, "payment_id": "pay-c"})

    first = _processor(served, "complete", token, "--payload", answer, "--wait", "30")
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("admitted: success for "), first.stdout
    assert run_id in first.stdout

    again = _processor(served, "complete", token, "--payload", answer, "--wait", "30", "--json")
    assert again.returncode == 0, again.stderr
    shown = json.loads(again.stdout)
    assert (shown["admission"], shown["run_id"], shown["outcome"]) == (
        "duplicate",
        run_id,
        "success",
    )

    forged = _processor(served, "complete", _forged(token), "--payload", answer, "--wait", "30")
    assert forged.returncode == 1, forged
    assert forged.stdout == ""
    assert forged.stderr.startswith("error: refused: invalid_token: "), forged.stderr
    as_json = _processor(
        served, "complete", _forged(token), "--fail", "no", "--wait", "30", "--json"
    )
    assert (as_json.returncode, as_json.stdout) == (1, "")
    error = json.loads(as_json.stderr)
    assert (error["refusal"], error["run_id"], error["outcome"]) == (
        "invalid_token",
        run_id,
        "failure",
    )
    assert "forged" in error["detail"] and error["error"].startswith("refused: invalid_token")


def test_cli_complete_without_a_wait_says_queued(served: Served) -> None:
    run_id, token = _order_waiting(served, "cli-q-1")
    answer = json.dumps({"order_id": "cli-q-1", "amount": 6.0, "payment_id": "pay-q"})
    sent = _processor(served, "complete", token, "--payload", answer)
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout.startswith("queued: success for "), sent.stdout
    assert "sent" not in sent.stdout
    shown = json.loads(_processor(served, "complete", token, "--payload", answer, "--json").stdout)
    assert shown["admission"] == "queued" and isinstance(shown["offset"], int)
    http = served.http()
    wait_until(lambda: status_of(http, run_id)["status"] == "succeeded", 60, "the run done")


@pytest.mark.parametrize("transport", ["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def test_cli_complete_with_no_processor_exits_3_at_its_deadline(
    transport: str, tmp_path: Path
) -> None:
    claims = tokens.TokenClaims("run-1", 1, "b1.0", 1)
    token = tokens.sign(KeyRing.single(b"no-processor-secret-0123456789ab"), claims)
    args = ("complete", token, "--payload", '{"x": 1}', "--wait", "1", "--json")
    started = time.monotonic()
    run = cli if transport == "embedded" else _kafka_cli
    done = run(tmp_path / "data", *args)
    assert time.monotonic() - started >= 1.0
    assert (done.returncode, done.stdout) == (3, ""), done
    error: dict[str, Any] = json.loads(done.stderr)
    assert "no processor answered in 1.0s" in error["error"]
    assert "queued" in error["error"]


def _kafka_cli(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``processor ARGS`` on a private topic prefix of the broker, no processor running."""
    from tests.kafka.support import KafkaSpace
    from tests.kafka_broker import kafka_bootstrap, unavailable_reason

    bootstrap = kafka_bootstrap()
    if bootstrap is None:
        pytest.skip(unavailable_reason())
    space = KafkaSpace.new(bootstrap)
    try:
        space.deployment(data_dir.with_name("client"))  # its topics
        return subprocess.run(
            [sys.executable, "-m", "processor", *args],
            env=space.env(data_dir),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        space.delete_topics()


def _decision(http: httpx.Client, run_id: str, key: str) -> dict[str, Any] | None:
    """``GET /api/completions/{run_id}/{key}``: the decision, or None (404: none yet)."""
    answer = http.get(f"/api/completions/{run_id}/{key}")
    if answer.status_code == 404:
        assert answer.json()["error"] == "unknown_completion", answer.text
        return None
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def test_a_sender_asks_later_what_became_of_its_queued_completion(served: Served) -> None:
    http = served.http()
    run_id, token = _order_waiting(served, "l-1")
    output = {"order_id": "l-1", "amount": 6.0, "payment_id": "pay-l"}
    completion = {"token": token, "outcome": "succeeded", "output": output}
    posted = http.post("/api/completions", json={**completion, "idempotency_key": "pay-l-1"})
    assert posted.status_code == 202, posted.text  # queued: the sender asks later

    found = wait_until(lambda: _decision(http, run_id, "pay-l-1"), 60, "the decision")
    assert (found["admission"], found["run_id"], found["outcome"]) == (
        "admitted",
        run_id,
        "success",
    )
    sent = posted.json()
    assert (found["partition"], found["offset"]) == (sent["partition"], sent["offset"])
    assert (found["interaction"], found["idempotency_key"]) == (sent["interaction"], "pay-l-1")
    assert isinstance(found["seq"], int) and found["decided_ms"] > 0

    # A later copy under the same key, with another answer, is refused: the key stays admitted.
    clash = {**completion, "output": {**output, "payment_id": "pay-other"}}
    refused = http.post(
        "/api/completions", params={"wait_s": 30}, json={**clash, "idempotency_key": "pay-l-1"}
    )
    assert refused.status_code == 409, refused.text
    assert _decision(http, run_id, "pay-l-1") == found

    # The same under a key of its own (with a slash: the key is the rest of the path).
    other = http.post(
        "/api/completions", params={"wait_s": 30}, json={**clash, "idempotency_key": "pay/l-2"}
    )
    assert other.status_code == 409, other.text
    conflict = _decision(http, run_id, "pay/l-2")
    assert conflict is not None
    assert (conflict["admission"], conflict["refusal"], conflict["detail"]) == (
        "refused",
        "conflicting_completion",
        other.json()["detail"],
    )
    assert conflict["idempotency_key"] == "pay/l-2" and conflict["decided_ms"] > 0


def test_a_forged_or_oversized_completion_is_found_refused_an_unknown_key_is_not(
    served: Served,
) -> None:
    http = served.http()
    run_id, token = _order_waiting(served, "l-3")
    forged = {"token": _forged(token), "outcome": "failed", "error": "no", "idempotency_key": "f-1"}
    assert http.post("/api/completions", params={"wait_s": 30}, json=forged).status_code == 422
    found = _decision(http, run_id, "f-1")
    assert found is not None
    assert (found["admission"], found["refusal"], found["outcome"]) == (
        "refused",
        "invalid_token",
        "failure",
    )
    assert "forged" in found["detail"]

    # Another producer than the API (no check of its own), in the JSON shape, too large.
    sender = CompletionClient(served.deployment.transport, served.deployment.topology)
    try:
        big = payload.dumps("x" * (600 * 1024))
        sender.send(token, "success", big, None, "big-1", wire="json")
    finally:
        sender.close()
    too_large = wait_until(lambda: _decision(http, run_id, "big-1"), 60, "the big one refused")
    assert (too_large["admission"], too_large["refusal"]) == ("refused", "payload_too_large")

    missing = http.get(f"/api/completions/{run_id}/never-sent")
    assert missing.status_code == 404, missing.text
    assert missing.json()["error"] == "unknown_completion"
    assert "not be decided yet" in missing.json()["detail"]
    assert http.get("/api/completions/no-such-run/f-1").status_code == 404
    # A read route: open on loopback without the bearer token.
    assert _decision(served.http(token=None), run_id, "f-1") == found
