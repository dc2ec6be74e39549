"""The JSON wire of boundary requests and completions, for systems without Avro.

An await target declared with ``wire="json"`` gets its requests on
boundary.requests as a JSON document with these headers::

    content-type: application/vnd.processor.request+json
    processor-schema: BoundaryRequest

    {"run_id": "...", "boundary": 1, "interaction": "b1.0", "item_index": 0,
     "target": "payments", "request": {...}, "deadline_ms": 1800000060000,
     "resume_token": "v2...."}

When the run is stopped while the interaction is open, a cancel notice follows in
the same shape, with ``"cancel"`` naming the stop reason (``cancelled``,
``timed_out`` or ``failed``), ``"request": null`` and an empty ``resume_token``;
ordinary requests have no ``cancel`` field.

and any system may answer on boundary.completions with a JSON completion,
recognized by its ``content-type: application/vnd.processor.completion+json``
header (or ``content-type: application/json`` plus ``processor-schema:
BoundaryCompletion``, for tools that only know the generic type)::

    {"token": "v2....", "outcome": "success", "payload": {...}}

``token`` and ``outcome`` (``success`` or ``failure``) are required;
``payload`` (any JSON value), ``error`` (a string) and ``idempotency_key`` (a
string, derived from the document when absent) are optional; any other field
makes the document ``malformed``.

An event for event waits may be produced to boundary.events the same way, with
``content-type: application/vnd.processor.event+json`` (or ``application/json``
plus ``processor-schema: SignalEvent``)::

    {"event_id": "psp-7781", "name": "payment_received", "correlation_key": "o-42",
     "correlation": {"region": "eu"}, "payload": {"amount": 12}}

``event_id`` and ``name`` are required, and exactly one of ``run_id`` and
``correlation_key`` (checked by admission, as for an Avro event); ``correlation``
(an object of strings) and ``payload`` (any JSON value) are optional.

docs/CONTRACT.md is the reference for other teams. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Literal

from processor.errors import FactDecodeError
from processor.facts import payload
from processor.facts.models import BoundaryCompletion, BoundaryRequest, SignalEvent

__all__ = [
    "COMPLETION_CONTENT_TYPE",
    "CONTENT_TYPE_HEADER",
    "EVENT_CONTENT_TYPE",
    "REQUEST_CONTENT_TYPE",
    "SCHEMA_HEADER",
    "WIRES",
    "HeaderPairs",
    "Wire",
    "completion_document",
    "completion_headers",
    "decode_completion",
    "decode_event",
    "decode_request",
    "encode_request",
    "event_document",
    "event_headers",
    "is_json_completion",
    "is_json_event",
    "is_json_request",
    "request_headers",
]

Wire = Literal["avro", "json"]
WIRES: tuple[Wire, ...] = ("avro", "json")

CONTENT_TYPE_HEADER = "content-type"
SCHEMA_HEADER = "processor-schema"
REQUEST_CONTENT_TYPE = "application/vnd.processor.request+json"
COMPLETION_CONTENT_TYPE = "application/vnd.processor.completion+json"
EVENT_CONTENT_TYPE = "application/vnd.processor.event+json"
_GENERIC_JSON = "application/json"

_COMPLETION_FIELDS = frozenset({"token", "outcome", "payload", "error", "idempotency_key"})
_EVENT_FIELDS = frozenset(
    {"event_id", "name", "run_id", "correlation_key", "correlation", "payload"}
)
_REQUEST_FIELDS = (
    "run_id",
    "boundary",
    "interaction",
    "item_index",
    "target",
    "request",
    "deadline_ms",
    "resume_token",
)

HeaderPairs = Sequence[tuple[str, bytes | None]]


def request_headers() -> tuple[tuple[str, bytes], ...]:
    """The headers of a JSON request record."""
    return (
        (CONTENT_TYPE_HEADER, REQUEST_CONTENT_TYPE.encode()),
        (SCHEMA_HEADER, b"BoundaryRequest"),
    )


def completion_headers() -> tuple[tuple[str, bytes], ...]:
    """The headers of a JSON completion record."""
    return (
        (CONTENT_TYPE_HEADER, COMPLETION_CONTENT_TYPE.encode()),
        (SCHEMA_HEADER, b"BoundaryCompletion"),
    )


def event_headers() -> tuple[tuple[str, bytes], ...]:
    """The headers of a JSON event record."""
    return (
        (CONTENT_TYPE_HEADER, EVENT_CONTENT_TYPE.encode()),
        (SCHEMA_HEADER, b"SignalEvent"),
    )


def encode_request(request: BoundaryRequest) -> bytes:
    """The JSON document of a request; its ``request`` is the JSON value itself."""
    document: dict[str, Any] = {name: getattr(request, name) for name in _REQUEST_FIELDS}
    document["request"] = payload.loads(request.request) if request.request else None
    if request.cancel is not None:
        document["cancel"] = request.cancel
    return payload.dumps(document)


def decode_request(value: bytes | None) -> BoundaryRequest:
    """A JSON request back into the model (for this package's own responders)."""
    document = _object(value, "request")
    try:
        fields = {name: document[name] for name in _REQUEST_FIELDS}
        cancel = document.get("cancel")
        fields["request"] = b"" if cancel is not None else payload.dumps(fields["request"])
        fields["cancel"] = cancel
        return BoundaryRequest(**fields)
    except (KeyError, ValueError, payload.InvalidPayloadError) as exc:
        raise FactDecodeError("malformed", f"not a JSON request: {exc}", value) from exc


def completion_document(completion: BoundaryCompletion) -> bytes:
    """The JSON document of a completion (what a JSON-speaking system sends)."""
    document: dict[str, Any] = {
        "token": completion.token,
        "outcome": completion.outcome,
        "idempotency_key": completion.idempotency_key,
    }
    if completion.payload:
        document["payload"] = payload.loads(completion.payload)
    if completion.error is not None:
        document["error"] = completion.error
    return payload.dumps(document)


def decode_completion(value: bytes | None) -> BoundaryCompletion:
    """A JSON completion as the same value an Avro one decodes to, else ``malformed``."""
    document = _document(value, "completion", _COMPLETION_FIELDS)
    token = _string(document, "token", value)
    outcome = document.get("outcome")
    if outcome not in ("success", "failure"):
        detail = f"outcome must be 'success' or 'failure', got {outcome!r}"
        raise FactDecodeError("malformed", detail, value)
    error = _optional_string(document, "error", value)
    body = payload.dumps(document["payload"]) if "payload" in document else b""
    key = _optional_string(document, "idempotency_key", value) or _derived_key(value or b"")
    return BoundaryCompletion(
        token=token,
        idempotency_key=key,
        outcome=outcome,
        payload=body,
        error=error,
        content_type=_GENERIC_JSON,
    )


def event_document(event: SignalEvent) -> bytes:
    """The JSON document of an event (what a JSON-speaking system sends)."""
    document: dict[str, Any] = {"event_id": event.event_id, "name": event.name}
    if event.run_id is not None:
        document["run_id"] = event.run_id
    if event.correlation_key is not None:
        document["correlation_key"] = event.correlation_key
    if event.correlation:
        document["correlation"] = dict(event.correlation)
    if event.payload:
        document["payload"] = payload.loads(event.payload)
    return payload.dumps(document)


def decode_event(value: bytes | None) -> SignalEvent:
    """A JSON event as the same value an Avro one decodes to, else ``malformed``."""
    document = _document(value, "event", _EVENT_FIELDS)
    correlation = document.get("correlation", {})
    if not isinstance(correlation, dict) or not all(
        isinstance(v, str) for v in correlation.values()
    ):
        raise FactDecodeError("malformed", "'correlation' must be an object of strings", value)
    return SignalEvent(
        event_id=_string(document, "event_id", value),
        name=_string(document, "name", value),
        run_id=_optional_string(document, "run_id", value),
        correlation_key=_optional_string(document, "correlation_key", value),
        correlation=correlation,
        payload=payload.dumps(document["payload"]) if "payload" in document else b"",
        content_type=_GENERIC_JSON,
    )


def is_json_event(headers: HeaderPairs) -> bool:
    """Whether a boundary.events record is in the JSON shape (by its headers)."""
    return _is_json(headers, EVENT_CONTENT_TYPE, "SignalEvent")


def is_json_request(headers: HeaderPairs) -> bool:
    """Whether a boundary.requests record is in the JSON shape (by its headers)."""
    return _is_json(headers, REQUEST_CONTENT_TYPE, "BoundaryRequest")


def is_json_completion(headers: HeaderPairs) -> bool:
    """Whether a boundary.completions record is in the JSON shape (by its headers)."""
    return _is_json(headers, COMPLETION_CONTENT_TYPE, "BoundaryCompletion")


def _is_json(headers: HeaderPairs, specific: str, schema: str) -> bool:
    content_type = _header(headers, CONTENT_TYPE_HEADER)
    if content_type is None:
        return False
    media = content_type.split(";", maxsplit=1)[0].strip().lower()
    if media == specific:
        return True
    return media == _GENERIC_JSON and _header(headers, SCHEMA_HEADER) == schema


def _header(headers: HeaderPairs, name: str) -> str | None:
    """The last value of header ``name`` (names compare case-insensitively)."""
    found = None
    for key, raw in headers:
        if key.lower() == name and raw is not None:
            found = raw.decode("utf-8", errors="replace").strip()
    return found


def _document(value: bytes | None, what: str, fields: frozenset[str]) -> dict[str, Any]:
    """The JSON object of a ``what`` with no field but ``fields``, else ``malformed``."""
    document = _object(value, what)
    unknown = sorted(set(document) - fields)
    if unknown:
        raise FactDecodeError("malformed", f"unknown fields in a JSON {what}: {unknown}", value)
    return document


def _object(value: bytes | None, what: str) -> dict[str, Any]:
    try:
        document = payload.loads(value or b"")
    except payload.InvalidPayloadError as exc:
        raise FactDecodeError("malformed", f"JSON {what}: {exc}", value) from exc
    if not isinstance(document, dict):
        detail = f"a JSON {what} is an object, got {type(document).__name__}"
        raise FactDecodeError("malformed", detail, value)
    return document


def _string(document: dict[str, Any], name: str, raw: bytes | None) -> str:
    found = document.get(name)
    if not isinstance(found, str) or not found:
        raise FactDecodeError("malformed", f"{name!r} must be a non-empty string", raw)
    return found


def _optional_string(document: dict[str, Any], name: str, raw: bytes | None) -> str | None:
    found = document.get(name)
    if found is not None and not isinstance(found, str):
        raise FactDecodeError("malformed", f"{name!r} must be a string or null", raw)
    return found


def _derived_key(raw: bytes) -> str:
    # The document's own digest: the same JSON sent twice carries the same key.
    return "json-" + hashlib.sha256(raw).hexdigest()[:32]
