"""Resume tokens over HTTP: every answer that would show one needs the bearer token, or
shows it redacted (README, "HTTP API and metrics"), on each transport.

A run waits at its await; its live resume token is then carried by three completions
the processor refuses while the interaction stays open (over the payload limit, in
Avro and in JSON, and in bytes that are no record), so ``admission.rejected`` keeps
it in their original bytes, and what became of the JSON one (its sender took the
token for its idempotency key) shows it; and by the input of a run that fails for
good, so the run's status, its history, its graph and its dead letter show it. Without the
bearer token no route's answer holds the token's signature; with it, every one of
them shows it whole.
The token was live all along: a completion with it succeeds the run.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from processor.clients.external import CompletionClient
from processor.facts import payload
from processor.web.context import STATIC_DIR
from tests.apps.support import wait_until
from tests.web.support import Served, request_of, serve, status_of, submit

TRANSPORTS = ["embedded", pytest.param("kafka", marks=pytest.mark.kafka)]
#: The processor's payload limit: small, so an oversized completion is cheap to send.
LIMIT = 2048
#: A refused completion of each kind, each keeping the token in its original bytes.
REFUSED = 3
#: The idempotency key of the oversized Avro completion (the JSON one's is the token).
OVERSIZED_KEY = "tok-oversized"
#: A schedule whose input holds the token.
SCHEDULE = "tok-schedule"


@dataclass(frozen=True)
class Exposed:
    """A processor whose answers could show ``token``, the live token of ``waiting``."""

    served: Served
    waiting: str  # a run waiting at its await
    failed: str  # a run whose input (and so its error and dead letter) holds the token
    token: str

    @property
    def signature(self) -> str:
        """The MAC: what makes the token a key (the claims before it are not secret)."""
        return self.token.rpartition(".")[2]

    @property
    def redacted(self) -> str:
        """The token as shown without the bearer token: its claims, its MAC starred."""
        claims = self.token.rpartition(".")[0]
        return f"{claims}.{'*' * len(self.signature)}"

    def paths(self) -> dict[str, list[str]]:
        """Each GET route of /api (as the OpenAPI document names it) and the requests
        made of it: every listing, both runs, their histories, every topic page."""
        return {
            "/api/runs": ["/api/runs?limit=1000", "/api/runs?status=running&target=payments"],
            "/api/runs/{run_id}": [f"/api/runs/{self.waiting}", f"/api/runs/{self.failed}"],
            "/api/runs/{run_id}/history": [
                f"/api/runs/{self.waiting}/history?limit=1000",
                f"/api/runs/{self.failed}/history?limit=1000",
            ],
            # The failed run's graph shows its failed step's error, which holds the token.
            "/api/runs/{run_id}/graph": [
                f"/api/runs/{self.waiting}/graph",
                f"/api/runs/{self.failed}/graph",
                f"/api/runs/{self.failed}/graph?at_seq=1",
            ],
            "/api/requests": ["/api/requests", f"/api/requests?run={self.waiting}"],
            "/api/rejected": ["/api/rejected?limit=1000"],
            "/api/dlq": ["/api/dlq?limit=1000"],
            # A schedule (paused) whose input holds the token.
            "/api/schedules": ["/api/schedules"],
            "/api/schedules/{schedule_id}": [f"/api/schedules/{SCHEDULE}"],
            "/api/completions/{run_id}/{idempotency_key}": [
                f"/api/completions/{self.waiting}/{OVERSIZED_KEY}",
                # A sender that took the token for its idempotency key: the answer shows it.
                f"/api/completions/{self.waiting}/{self.token}",
            ],
        }


@pytest.fixture(scope="module", params=TRANSPORTS)
def exposed(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Exposed]:
    path = tmp_path_factory.mktemp(f"tokens-{request.param}")
    served = serve(request.param, path, env={"PROCESSOR_MAX_PAYLOAD_BYTES": str(LIMIT)})
    try:
        yield _expose(served)
    finally:
        served.close()


def _expose(served: Served) -> Exposed:
    http = served.http()
    waiting = submit(http, "orders", {"order_id": "tok-1", "amount": 3})["run_id"]
    found = wait_until(lambda: request_of(served.deployment, waiting), 60, "the request")
    token = found.resume_token
    # Another producer than this package's clients: no check before producing.
    sender = CompletionClient(served.deployment.transport, served.deployment.topology)
    try:
        sender.complete(token, "p" * LIMIT, OVERSIZED_KEY)  # refused payload_too_large: still open
        sender.send(token, "success", payload.dumps("q" * LIMIT), None, token, wire="json")
        sender.produce_raw(waiting, b"no record, but a token: " + token.encode())
        sender.flush()
    finally:
        sender.close()
    failed = submit(http, "non_retryable", {"note": token})["run_id"]
    schedule = {"schedule_id": SCHEDULE, "pipeline": "fulfil", "input": {"note": token}}
    assert http.post("/api/schedules", json={**schedule, "interval_s": 3600}).status_code == 201
    assert http.post(f"/api/schedules/{SCHEDULE}/pause").status_code == 200
    exposed = Exposed(served, waiting, failed, token)
    wait_until(lambda: _kept(exposed), 90, "the refused completions and the dead letter")
    return exposed


def _kept(exposed: Exposed) -> bool:
    """Whether admission.rejected holds the refused completions and runs.dlq the run."""
    http = exposed.served.http()
    rejected = http.get("/api/rejected", params={"limit": 1000}).json()["records"]
    holding = [r for r in rejected if exposed.token.encode().hex() in (r["original_value"] or "")]
    dead = http.get("/api/dlq", params={"limit": 1000}).json()["records"]
    return len(holding) == REFUSED and exposed.failed in {r["run_id"] for r in dead}


def _reveals(answer: httpx.Response, exposed: Exposed) -> list[str]:
    """The forms of the token's signature the answer shows: as text, or in hex."""
    forms = {"text": exposed.signature, "hex": exposed.signature.encode().hex()}
    return [name for name, form in forms.items() if form in answer.text]


@pytest.mark.parametrize("bearer", [None, "wrong-token"])
def test_no_answer_shows_a_resume_token_without_the_bearer_token(
    exposed: Exposed, bearer: str | None
) -> None:
    http = exposed.served.http(token=bearer)
    shown = {}
    for route, paths in exposed.paths().items():
        for path in paths:
            answer = http.get(path)
            assert answer.status_code in (200, 401), (path, answer.text)
            if route == "/api/requests":  # it is made of tokens: the bearer token only
                assert answer.status_code == 401, answer.text
            shown[path] = _reveals(answer, exposed)
    assert {path: forms for path, forms in shown.items() if forms} == {}


def test_a_redacted_answer_keeps_the_claims_of_the_token(exposed: Exposed) -> None:
    http = exposed.served.http(token=None)
    rejected = http.get("/api/rejected", params={"limit": 1000}).json()["records"]
    redacted = exposed.redacted.encode().hex()
    assert sum(redacted in (r["original_value"] or "") for r in rejected) == REFUSED
    assert {"payload_too_large", "malformed"} <= {r["reason"] for r in rejected}
    dead = http.get("/api/dlq", params={"limit": 1000}).json()["records"]
    (letter,) = [r for r in dead if r["run_id"] == exposed.failed]
    assert letter["input"] == {"note": exposed.redacted}
    assert http.get(f"/api/schedules/{SCHEDULE}").json()["input"] == {"note": exposed.redacted}
    assert exposed.redacted in status_of(http, exposed.failed)["error"]
    asked = http.get(f"/api/completions/{exposed.waiting}/{exposed.token}").json()
    assert (asked["refusal"], asked["idempotency_key"]) == ("payload_too_large", exposed.redacted)


def test_the_bearer_token_shows_the_token_whole_and_it_is_live(exposed: Exposed) -> None:
    http = exposed.served.http()
    shown = {
        path: _reveals(http.get(path), exposed)
        for paths in exposed.paths().values()
        for path in paths
    }
    assert shown[f"/api/requests?run={exposed.waiting}"] == ["text"]
    assert shown["/api/rejected?limit=1000"] == ["hex"]  # the original bytes, whole
    assert shown["/api/dlq?limit=1000"] == ["text"]
    assert shown[f"/api/completions/{exposed.waiting}/{exposed.token}"] == ["text"]
    assert shown[f"/api/runs/{exposed.failed}/history?limit=1000"] == ["text"]
    assert shown[f"/api/runs/{exposed.failed}/graph"] == ["text"]
    assert shown[f"/api/schedules/{SCHEDULE}"] == ["text"]
    # The refused completions left the interaction open: its token still answers it.
    output = {"order_id": "tok-1", "amount": 3.6, "payment_id": "pay-tok"}
    answer = http.post(
        "/api/completions", json={"token": exposed.token, "outcome": "succeeded", "output": output}
    )
    assert answer.status_code == 202, answer.text
    wait_until(
        lambda: status_of(http, exposed.waiting)["status"] == "succeeded", 90, "the run to end"
    )


def test_every_get_route_and_every_call_of_the_page_is_checked_here(exposed: Exposed) -> None:
    document = exposed.served.http(token=None).get("/openapi.json").json()
    routes = {p for p, methods in document["paths"].items() if p.startswith("/api/")}
    gets = {p for p in routes if "get" in document["paths"][p]}
    assert gets == set(exposed.paths())
    # The page (static/app.js) calls the API with paths like "api/runs" and
    # `api/runs/${encodeURIComponent(runId)}/history`.
    script = (STATIC_DIR / "app.js").read_text()
    called = {
        "/" + re.sub(r"\$\{[^}]*\}", "{run_id}", found)
        for found in re.findall(r"[\"`](api/[^\"`?]*)[\"`]", script)
    }
    assert called and called <= set(exposed.paths()), called
