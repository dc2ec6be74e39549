"""Triggers: a run for each record of a user's own topic.

```python
orders = Pipeline("orders", trigger=Trigger("shop.orders", idempotency_field="order_id"))

# or, with a function from the record to the run input:
@orders.trigger("shop.orders")
def order_input(rec: TriggerRecord) -> dict:
    return {"order_id": rec.json()["id"], "lines": rec.json()["lines"]}
```

The record's value goes through a *decoder* first (by name: ``"json"``, the
default, ``"bytes"``, or ``"avro"``: Confluent-framed Avro through the
deployment's schema registry, decoded to a dict; see ``DecoderFactory``), then
through ``to_input``. Each record
becomes one ``SubmitRun`` whose run id derives from an idempotency key: by default
the record's pipeline, topic, partition and offset, or, with ``idempotency_field``,
the pipeline and that field of the decoded record (two records with the same value
start one run). ``trigger_submit`` is that mapping: pure, total, and the only
place that calls the user's function. A record it cannot decode or map becomes a
``TriggerRefusal`` (``trigger_decode_failed``, ``trigger_mapping_failed``,
``trigger_key_missing``) that the trigger stage sends to admission.rejected.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from processor.config.settings import Settings
from processor.errors import ConfigurationError, TransportError
from processor.facts import payload
from processor.facts.models import SubmitRun

__all__ = [
    "BUILTIN_DECODERS",
    "DECODE_FAILED",
    "KEY_MISSING",
    "MAPPING_FAILED",
    "Decoder",
    "DecoderFactory",
    "Trigger",
    "TriggerDecodeError",
    "TriggerRecord",
    "TriggerRefusal",
    "trigger_key",
    "trigger_submit",
]

DECODE_FAILED = "trigger_decode_failed"
MAPPING_FAILED = "trigger_mapping_failed"
KEY_MISSING = "trigger_key_missing"
_MAX_DETAIL = 2000  # characters of an exception's text kept in a rejection
_COMMAND_NAMESPACE = uuid.UUID("0b8f6c47-25a4-4c1e-9d7e-5a0f3b9e61d2")

#: Turns a record's value into what ``to_input`` sees as ``rec.decoded``; raises on bad input.
Decoder = Callable[[bytes | None], Any]
#: Builds a decoder for a deployment (a registry decoder needs the registry's URL).
DecoderFactory = Callable[[Settings], Decoder]


class TriggerDecodeError(ValueError):
    """A record's value is not what the trigger's decoder (or ``rec.json()``) expects."""


def _json_value(value: bytes | None) -> Any:
    if value is None:
        raise TriggerDecodeError("the record has no value (a tombstone)")
    try:
        return payload.loads(value)
    except payload.InvalidPayloadError as exc:
        raise TriggerDecodeError(str(exc)) from exc


def _raw_value(value: bytes | None) -> Any:
    return value


#: The decoders every deployment offers; the engine may add more (``decoders=`` of the stage).
BUILTIN_DECODERS: Mapping[str, DecoderFactory] = {
    "json": lambda settings: _json_value,
    "bytes": lambda settings: _raw_value,
}


@dataclass(frozen=True, slots=True)
class TriggerRecord:
    """What a trigger's ``to_input`` receives: one record of the user's topic."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int = 0
    decoded: Any = None  # the decoder's result (with "bytes": the value itself)

    def json(self) -> Any:
        """The value parsed as JSON; ``TriggerDecodeError`` when it is not JSON."""
        return _json_value(self.value)

    def text(self) -> str:
        """The value as UTF-8 text; ``TriggerDecodeError`` when it is not."""
        try:
            return (self.value or b"").decode()
        except UnicodeDecodeError as exc:
            raise TriggerDecodeError(f"not UTF-8: {exc}") from exc


def _decoded_input(rec: TriggerRecord) -> Any:
    return rec.decoded


@dataclass(frozen=True, slots=True)
class Trigger:
    """Start a run of the pipeline for each record of ``topic``.

    Args:
        topic: the user's topic (its physical name: no deployment prefix is added).
        to_input: the record -> the run input (any JSON value); by default the
            decoded value.
        idempotency_field: a field of the decoded record (a JSON object) whose
            value names the run; by default the record's position does.
        decoder: the name of the decoder of the record's value ("json", "bytes",
            or "avro", which needs PROCESSOR_SCHEMA_REGISTRY_URL).
    """

    topic: str
    to_input: Callable[[TriggerRecord], Any] = field(default=_decoded_input)
    idempotency_field: str | None = None
    decoder: str = "json"

    def __post_init__(self) -> None:
        if not self.topic:
            raise ConfigurationError("a trigger needs a topic")
        if self.idempotency_field == "":
            raise ConfigurationError("idempotency_field, when given, must name a field")


@dataclass(frozen=True, slots=True)
class TriggerRefusal:
    """Why a record started no run: a reason for admission.rejected and its detail."""

    reason: str
    detail: str


def trigger_submit(
    pipeline: str,
    trigger: Trigger,
    decoder: Decoder,
    record: TriggerRecord,
    now_ms: int,
) -> SubmitRun | TriggerRefusal:
    """The SubmitRun that ``record`` starts, or why it starts none (pure but for ``to_input``).

    ``record.decoded`` is ignored: the decoder fills it in here. A decoder's
    ``TransportError`` (its schema registry is unreachable) propagates: the record
    is fine, and the stage retries it later.
    """
    try:
        decoded = decoder(record.value)
    except TransportError:
        raise  # the decoder's registry is unreachable: not the record's fault, retry it
    except Exception as exc:  # any decoder's failure, a plug-in's too, is the record's fault
        return TriggerRefusal(DECODE_FAILED, _exception_text(exc))
    rec = replace(record, decoded=decoded)
    try:
        run_input = payload.dumps(trigger.to_input(rec))
    except TriggerDecodeError as exc:  # rec.json() inside the user's function
        return TriggerRefusal(DECODE_FAILED, _exception_text(exc))
    except Exception as exc:  # the user's function raised, or returned no JSON value
        return TriggerRefusal(MAPPING_FAILED, _exception_text(exc))
    key = trigger_key(pipeline, trigger, rec)
    if isinstance(key, TriggerRefusal):
        return key
    return SubmitRun(
        command_id=str(uuid.uuid5(_COMMAND_NAMESPACE, _position_key(pipeline, record))),
        run_id=payload.derive_run_id(key),
        pipeline=pipeline,
        input=run_input,
        idempotency_key=key,
        submitted_ms=now_ms,
    )


def trigger_key(pipeline: str, trigger: Trigger, rec: TriggerRecord) -> str | TriggerRefusal:
    """The idempotency key of the run ``rec`` starts: a JSON array, so parts never collide."""
    name = trigger.idempotency_field
    if name is None:
        return _position_key(pipeline, rec)
    fields = rec.decoded if isinstance(rec.decoded, Mapping) else _json_object(rec)
    if isinstance(fields, TriggerRefusal):
        return fields
    value = fields.get(name)
    if not isinstance(value, str | int) or isinstance(value, bool):
        found = "missing" if value is None else f"a {type(value).__name__}, not a string or integer"
        return TriggerRefusal(KEY_MISSING, f"idempotency field {name!r}: {found}")
    return json.dumps(["trigger", pipeline, "field", name, value], ensure_ascii=False)


def _position_key(pipeline: str, rec: TriggerRecord) -> str:
    return json.dumps(["trigger", pipeline, rec.topic, rec.partition, rec.offset])


def _json_object(rec: TriggerRecord) -> Mapping[str, Any] | TriggerRefusal:
    try:
        value = rec.json()
    except TriggerDecodeError as exc:
        return TriggerRefusal(DECODE_FAILED, _exception_text(exc))
    if not isinstance(value, Mapping):
        return TriggerRefusal(KEY_MISSING, f"the record is a JSON {type(value).__name__}")
    return value


def _exception_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= _MAX_DETAIL else text[: _MAX_DETAIL - 3] + "..."
