"""Hypothesis-driven requests to every route of the HTTP API (embedded log, in-process).

Malformed JSON, huge bodies, wrong types, hostile path parameters and query values,
missing, wrong and forged bearer and resume tokens, odd methods and content types:
every answer is 2xx or 4xx (never 5xx), an error answer is ``{"error", "detail"}``,
and no answer carries a stack trace. ``PROCESSOR_FUZZ_HTTP_EXAMPLES`` requests per
test (200 by default).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processor.facts import tokens
from processor.web.wiring import ProcessorWeb
from tests.fuzz.support import Fuzzing, fuzzing

TOKEN = "fuzz-token-" + uuid.uuid4().hex[:8]
EXAMPLES = int(os.environ.get("PROCESSOR_FUZZ_HTTP_EXAMPLES", "200"))
GENUINE = "<a genuine token of no interaction>"
HUGE = 2 * 1024 * 1024  # over the payload limit (512 KiB) and over what a request should be

#: Every route, its path parameters as ``{}``.
ROUTES = [
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/"),
    ("GET", "/docs"),
    ("GET", "/openapi.json"),
    ("GET", "/api/runs"),
    ("POST", "/api/runs"),
    ("GET", "/api/runs/{}"),
    ("GET", "/api/runs/{}/history"),
    ("POST", "/api/runs/{}/cancel"),
    ("POST", "/api/runs/{}/redrive"),
    ("POST", "/api/completions"),
    ("GET", "/api/completions/{}/{}"),
    ("GET", "/api/rejected"),
    ("GET", "/api/dlq"),
    ("GET", "/api/requests"),
]
QUERY_NAMES = [
    "status", "pipeline", "since", "until", "target", "cursor", "limit", "after", "wait_s", "run",
]  # fmt: skip


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Fuzzing, httpx.Client]]:
    data_dir: Path = tmp_path_factory.mktemp("http-fuzz") / "data"
    with fuzzing("embedded", data_dir, http_token=TOKEN) as fz:
        web = ProcessorWeb(fz.host, port=0)
        address = web.start()
        try:
            with httpx.Client(base_url=address, timeout=60) as client:
                yield fz, client
        finally:
            web.stop()


# --- strategies -------------------------------------------------------------------------------

_json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    _json_leaf,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
hostile_text = st.one_of(
    st.text(max_size=30),
    st.sampled_from(
        ["", " ", "..", "../..", "%00", "\x00", "a/b", "?x=1", "#", "é" * 300, "9" * 400]
    ),
    st.builds(lambda: str(uuid.uuid4())),
)


def _forged_token(draw: Any) -> str:
    claims = tokens.TokenClaims(str(uuid.uuid4()), draw(st.integers(0, 3)), "i0", 1)
    from processor.facts.keyring import KeyRing

    signed = tokens.sign(KeyRing.single(b"not-the-deployment-key-0123456789"), claims)
    return draw(
        st.sampled_from(
            [
                signed,
                signed[:-1] + "A",
                "v2." + "." * 5,
                "x" * 5000,
                "",
                signed.replace(".", ".."),
                GENUINE,  # the test signs it with the deployment's key
            ]
        )
    )


@st.composite
def bodies(draw: Any, path: str) -> tuple[bytes | None, str | None]:
    """A request body and its content type: shaped for the route, or not at all."""
    shape = draw(st.sampled_from(["shaped", "json", "malformed", "huge", "none", "form"]))
    if shape == "none":
        return None, draw(st.sampled_from([None, "application/json"]))
    if shape == "malformed":
        raw = draw(
            st.sampled_from([b"{", b'{"a":', b"\xff\xfe", b"[" * 100_000, b"nul", b'{"a":1}{}'])
        )
        return raw, "application/json"
    if shape == "huge":
        return b'{"pipeline": "steps3", "input": "' + b"x" * HUGE + b'"}', "application/json"
    if shape == "form":
        return b"a=1&b=2", draw(
            st.sampled_from(["application/x-www-form-urlencoded", "text/plain"])
        )
    if shape == "json":
        return json.dumps(draw(json_values)).encode(), "application/json"
    if path == "/api/runs":
        document = {
            "pipeline": draw(
                st.one_of(st.sampled_from(["steps3", "scalar", "nope", ""]), json_values)
            ),
            "input": draw(json_values),
        }
        for name in ("idempotency_key", "deadline_s", "extra"):
            if draw(st.booleans()):
                document[name] = draw(json_values | hostile_text | st.floats(min_value=0))
    elif path == "/api/completions":
        document = {
            "token": _forged_token(draw) if draw(st.booleans()) else draw(json_values),
            "outcome": draw(st.sampled_from(["succeeded", "failed", "success", 1])),
        }
        for name in ("output", "error", "idempotency_key"):
            if draw(st.booleans()):
                document[name] = draw(json_values)
    else:
        document = {
            name: draw(json_values | hostile_text | st.integers(-(2**70), 2**70))
            for name in draw(st.lists(st.sampled_from(["reason", "from_step", "x"]), max_size=2))
        }
    return json.dumps(document).encode(), "application/json"


@st.composite
def requests(draw: Any) -> dict[str, Any]:
    method, template = draw(st.sampled_from(ROUTES))
    if draw(st.integers(0, 9)) == 0:  # now and then another method
        method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"]))
    params = [
        quote(draw(hostile_text | st.just("\ud800x")), safe="", errors="surrogatepass")
        for _ in range(template.count("{}"))
    ]
    path = template.format(*params)
    query = {
        name: draw(st.one_of(hostile_text, st.integers(-(2**70), 2**70).map(str), st.just("1")))
        for name in draw(st.lists(st.sampled_from(QUERY_NAMES), max_size=3, unique=True))
    }
    if "wait_s" in query:  # a completion waits at most this long: keep the run short
        query["wait_s"] = draw(st.sampled_from(["0", "0.5", "-1", "61", "nan", "inf", "x"]))
    auth = draw(st.sampled_from(["good", "none", "wrong", "scheme", "garbage"]))
    headers = {
        "good": {"Authorization": f"Bearer {TOKEN}"},
        "none": {},
        "wrong": {"Authorization": "Bearer " + TOKEN[::-1]},
        "scheme": {"Authorization": f"Basic {TOKEN}"},
        "garbage": {"Authorization": "Bearer \u00e9\u2603"},
    }[auth]
    if draw(st.booleans()):
        headers["traceparent"] = draw(
            st.sampled_from(["00-" + "0" * 32 + "-" + "0" * 16 + "-01", "garbage", "00-x-y-z"])
        )
    body, content_type = (
        draw(bodies(template)) if method in ("POST", "PUT", "PATCH") else (None, None)
    )
    if content_type is not None:
        headers["Content-Type"] = content_type
    raw_headers = {name: value.encode() for name, value in headers.items()}  # é is not ASCII
    return {"method": method, "url": path, "params": query, "headers": raw_headers, "content": body}


# --- the test ---------------------------------------------------------------------------------


def _check(answer: httpx.Response, request: dict[str, Any]) -> None:
    where = f"{request['method']} {request['url']} {request['params']}"
    assert answer.status_code < 500, (where, answer.status_code, answer.text[:500])
    text = answer.text
    assert "Traceback" not in text and 'File "' not in text, (where, text[:500])
    if answer.status_code >= 400 and request["method"] != "HEAD":
        body = answer.json()
        assert isinstance(body.get("error"), str) and body["error"], (where, body)
        assert isinstance(body.get("detail"), str) and body["detail"], (where, body)


@pytest.mark.slow
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(request=requests())
def test_every_route_answers_fuzzed_requests_with_4xx_not_500(
    served: tuple[Fuzzing, httpx.Client], request: dict[str, Any]
) -> None:
    fz, client = served
    if request["content"] and GENUINE.encode() in request["content"]:
        claims = tokens.TokenClaims(str(uuid.uuid4()), 1, "i0", 1)
        genuine = tokens.sign(fz.keys, claims).encode()
        request = {**request, "content": request["content"].replace(GENUINE.encode(), genuine)}
    answer = client.request(**request)
    _check(answer, request)
    assert fz.host.errors == []


@pytest.mark.parametrize("name", ["since", "until"])
def test_a_time_past_the_index_range_is_a_bad_query(
    served: tuple[Fuzzing, httpx.Client], name: str
) -> None:
    """Found by the fuzzer: ``until`` over 2**64 + 1 failed in the index key (500). A
    time is an Avro long: beyond one, the query is refused."""
    _, client = served
    for value in (2**63 - 1, 2**63, 2**64 + 1, 2**70):
        request = {"method": "GET", "url": "/api/runs", "params": {name: str(value)}}
        answer = client.request(**request)
        _check(answer, request)
        expected = (200, None) if value < 2**63 else (400, "bad_query")
        assert (answer.status_code, answer.json().get("error")) == expected, value


@pytest.mark.parametrize("deadline_s", [1e300, 9.3e15, 1e-9, 1.5])
def test_a_submit_with_any_deadline_is_answered(
    served: tuple[Fuzzing, httpx.Client], deadline_s: float
) -> None:
    """Found by the fuzzer: a deadline_s past what an Avro long holds in milliseconds
    failed to encode in the client (500). Over 10**15 s it is an invalid request."""
    _, client = served
    body = {"pipeline": "steps3", "input": {"n": 1}, "deadline_s": deadline_s}
    request = {
        "method": "POST",
        "url": "/api/runs",
        "params": {},
        "headers": {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        "content": json.dumps(body).encode(),
    }
    answer = client.request(**request)
    _check(answer, request)
    if deadline_s > 1e15:
        assert (answer.status_code, answer.json()["error"]) == (422, "invalid_request")
    else:
        assert answer.status_code == 201, answer.text


@pytest.mark.parametrize("from_step", [2**31, 2**40, 2**70, 2**31 - 1])
def test_a_redrive_from_any_step_is_answered(
    served: tuple[Fuzzing, httpx.Client], from_step: int
) -> None:
    """Found by the fuzzer: a from_step past an Avro int failed to encode in the
    client (500); it is an invalid request."""
    _, client = served
    request = {
        "method": "POST",
        "url": f"/api/runs/{uuid.uuid4()}/redrive",
        "params": {},
        "headers": {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        "content": json.dumps({"from_step": from_step}).encode(),
    }
    answer = client.request(**request)
    _check(answer, request)
    expected = (404, "unknown_run") if from_step < 2**31 else (422, "invalid_request")
    assert (answer.status_code, answer.json()["error"]) == expected
