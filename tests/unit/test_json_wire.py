"""The JSON shape of requests and completions (processor/facts/json_wire.py): pure."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.errors import FactDecodeError
from processor.facts import json_wire, payload
from processor.facts.models import BoundaryCompletion, BoundaryRequest, SignalEvent

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**12), 10**12) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


def _request(body: bytes) -> BoundaryRequest:
    return BoundaryRequest(
        run_id="r-1",
        boundary=1,
        interaction="b1.0",
        item_index=0,
        target="payments",
        request=body,
        deadline_ms=1_800_000_060_000,
        resume_token="v2.k.claims.mac",
    )


@given(JSON_VALUES)
def test_a_request_round_trips_with_its_payload_as_a_json_value(value: object) -> None:
    body = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    request = _request(body)
    document = json.loads(json_wire.encode_request(request))
    assert document["request"] == value
    assert document["resume_token"] == "v2.k.claims.mac"
    assert json_wire.decode_request(json_wire.encode_request(request)) == request


@given(JSON_VALUES, st.sampled_from(["success", "failure"]), st.none() | st.text(max_size=10))
def test_a_completion_round_trips(value: object, outcome: str, error: str | None) -> None:
    completion = BoundaryCompletion(
        token="v2.k.c.m",
        idempotency_key="key-1",
        outcome=outcome,  # type: ignore[arg-type]
        payload=json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False
        ).encode(),
        error=error,
    )
    assert json_wire.decode_completion(json_wire.completion_document(completion)) == completion


def test_the_shortest_completion_takes_a_key_derived_from_the_document() -> None:
    raw = b'{"token": "v2.k.c.m", "outcome": "success", "payload": {"ok": true}}'
    first = json_wire.decode_completion(raw)
    assert (first.token, first.outcome, first.payload) == ("v2.k.c.m", "success", b'{"ok":true}')
    assert first.idempotency_key.startswith("json-")
    assert json_wire.decode_completion(raw).idempotency_key == first.idempotency_key
    other = json_wire.decode_completion(raw.replace(b"true", b"false"))
    assert other.idempotency_key != first.idempotency_key


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"not json",
        b"\xff\xfe",
        b"[1, 2]",
        b'"a string"',
        b'{"outcome": "success"}',
        b'{"token": "", "outcome": "success"}',
        b'{"token": 7, "outcome": "success"}',
        b'{"token": "v2.k.c.m"}',
        b'{"token": "v2.k.c.m", "outcome": "done"}',
        b'{"token": "v2.k.c.m", "outcome": "failure", "error": 3}',
        b'{"token": "v2.k.c.m", "outcome": "success", "idempotency_key": ["x"]}',
        b'{"token": "v2.k.c.m", "outcome": "success", "paylaod": {}}',
    ],
)
def test_a_document_that_is_not_the_shape_is_malformed_and_keeps_its_bytes(raw: bytes) -> None:
    with pytest.raises(FactDecodeError) as caught:
        json_wire.decode_completion(raw)
    assert caught.value.reason == "malformed"
    assert caught.value.raw == raw


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ((("content-type", b"application/vnd.processor.completion+json"),), True),
        ((("Content-Type", b"application/vnd.processor.completion+json; charset=utf-8"),), True),
        (
            (("content-type", b"application/json"), ("processor-schema", b"BoundaryCompletion")),
            True,
        ),
        ((("content-type", b"application/json"),), False),
        ((("content-type", b"application/json"), ("processor-schema", b"BoundaryRequest")), False),
        ((("content-type", b"application/vnd.processor.request+json"),), False),
        ((), False),
        ((("content-type", None),), False),
    ],
)
def test_a_json_completion_is_recognized_by_its_headers(
    headers: tuple[tuple[str, bytes | None], ...], expected: bool
) -> None:
    assert json_wire.is_json_completion(headers) is expected


def test_a_request_carries_headers_that_name_its_shape() -> None:
    assert json_wire.is_json_request(json_wire.request_headers())
    assert not json_wire.is_json_completion(json_wire.request_headers())
    assert json_wire.is_json_completion(json_wire.completion_headers())


# --- events ------------------------------------------------------------------------------

NAMES = st.text(alphabet="abcdefgh-_", min_size=1, max_size=8)


@given(
    NAMES,
    st.one_of(st.tuples(NAMES, st.none()), st.tuples(st.none(), NAMES)),
    st.dictionaries(NAMES, st.text(max_size=5), max_size=3),
    JSON_VALUES,
)
def test_an_event_round_trips(
    name: str, address: tuple[str | None, str | None], correlation: dict[str, str], value: object
) -> None:
    run_id, key = address
    event = SignalEvent(
        event_id="e-1",
        name=name,
        run_id=run_id,
        correlation_key=key,
        correlation=correlation,
        payload=payload.dumps(value),
        content_type="application/json",
    )
    assert json_wire.decode_event(json_wire.event_document(event)) == event


@pytest.mark.parametrize(
    "raw",
    [
        b"[]",
        b'{"name": "paid", "run_id": "r"}',
        b'{"event_id": "", "name": "paid", "run_id": "r"}',
        b'{"event_id": "e", "name": 7, "run_id": "r"}',
        b'{"event_id": "e", "name": "paid", "run_id": 5}',
        b'{"event_id": "e", "name": "paid", "run_id": "r", "correlation": {"a": 1}}',
        b'{"event_id": "e", "name": "paid", "run_id": "r", "correlation": ["a"]}',
        b'{"event_id": "e", "name": "paid", "run_id": "r", "fanned_out": true}',
    ],
)
def test_an_event_that_is_not_the_shape_is_malformed_and_keeps_its_bytes(raw: bytes) -> None:
    with pytest.raises(FactDecodeError) as caught:
        json_wire.decode_event(raw)
    assert caught.value.reason == "malformed"
    assert caught.value.raw == raw


def test_an_event_carries_headers_that_name_its_shape() -> None:
    assert json_wire.is_json_event(json_wire.event_headers())
    generic = (("content-type", b"application/json"), ("processor-schema", b"SignalEvent"))
    assert json_wire.is_json_event(generic)
    assert not json_wire.is_json_event(json_wire.completion_headers())
    assert not json_wire.is_json_completion(json_wire.event_headers())
