"""The pure part of triggers: a user record -> one SubmitRun, or a refusal with a reason."""

from __future__ import annotations

import json
from typing import Any

import pytest

import processor
from processor.config.settings import Settings
from processor.engine.trigger import bind_triggers
from processor.errors import ConfigurationError, TransportError
from processor.facts import payload
from processor.facts.models import SubmitRun
from processor.worker.pipeline import Application, Pipeline
from processor.worker.trigger import (
    BUILTIN_DECODERS,
    DECODE_FAILED,
    KEY_MISSING,
    MAPPING_FAILED,
    Decoder,
    Trigger,
    TriggerRecord,
    TriggerRefusal,
    trigger_submit,
)

NOW = 1_800_000_000_000
JSON = BUILTIN_DECODERS["json"](Settings())
RAW = BUILTIN_DECODERS["bytes"](Settings())


def record(value: bytes | None, *, partition: int = 0, offset: int = 0, topic: str = "shop.orders"):
    return TriggerRecord(topic, partition, offset, b"customer-7", value)


def submit(trigger: Trigger, rec: TriggerRecord, decoder: Decoder = JSON, pipeline: str = "orders"):
    return trigger_submit(pipeline, trigger, decoder, rec, NOW)


def submitted(outcome: SubmitRun | TriggerRefusal) -> SubmitRun:
    assert isinstance(outcome, SubmitRun), outcome
    return outcome


def refused(outcome: SubmitRun | TriggerRefusal) -> TriggerRefusal:
    assert isinstance(outcome, TriggerRefusal), outcome
    return outcome


def test_a_json_record_becomes_a_submit_of_its_value_keyed_by_its_position() -> None:
    command = submitted(submit(Trigger("shop.orders"), record(b'{"id": 3}', partition=2, offset=9)))

    assert command.pipeline == "orders"
    assert json.loads(command.input) == {"id": 3}
    assert command.submitted_ms == NOW
    assert command.idempotency_key == json.dumps(["trigger", "orders", "shop.orders", 2, 9])
    # The processor refuses a keyed submit whose run id is not derived from the key.
    assert command.run_id == payload.derive_run_id(command.idempotency_key)


def test_the_same_record_always_makes_the_same_command_and_other_records_other_runs() -> None:
    trigger = Trigger("shop.orders")
    first = submitted(submit(trigger, record(b"{}", partition=1, offset=5)))
    again = submitted(submit(trigger, record(b"{}", partition=1, offset=5)))
    assert (again.run_id, again.command_id) == (first.run_id, first.command_id)

    neighbours = [
        record(b"{}", partition=1, offset=6),
        record(b"{}", partition=2, offset=5),
        record(b"{}", partition=1, offset=5, topic="shop.returns"),
    ]
    run_ids = {submitted(submit(trigger, rec)).run_id for rec in neighbours}
    assert len(run_ids) == 3 and first.run_id not in run_ids
    other_pipeline = submitted(submit(trigger, record(b"{}", partition=1, offset=5), pipeline="b"))
    assert other_pipeline.run_id != first.run_id


def test_to_input_maps_the_record_and_sees_its_position_and_key() -> None:
    def to_input(rec: TriggerRecord) -> dict[str, Any]:
        return {"id": rec.json()["id"], "key": (rec.key or b"").decode(), "at": rec.offset}

    command = submitted(submit(Trigger("shop.orders", to_input), record(b'{"id": 1}', offset=4)))

    assert json.loads(command.input) == {"id": 1, "key": "customer-7", "at": 4}


def test_an_idempotency_field_names_the_run_whatever_the_position() -> None:
    trigger = Trigger("shop.orders", idempotency_field="order_id")
    first = submitted(submit(trigger, record(b'{"order_id": "o-1"}', partition=0, offset=1)))
    second = submitted(submit(trigger, record(b'{"order_id": "o-1"}', partition=2, offset=7)))
    other = submitted(submit(trigger, record(b'{"order_id": "o-2"}', partition=0, offset=2)))
    numeric = submitted(submit(trigger, record(b'{"order_id": 1}', partition=0, offset=3)))

    assert first.run_id == second.run_id
    assert len({first.run_id, other.run_id, numeric.run_id}) == 3
    assert first.idempotency_key == json.dumps(["trigger", "orders", "field", "order_id", "o-1"])
    assert first.command_id != second.command_id  # two records, two commands, one run


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (b'{"other": 1}', "missing"),
        (b'{"order_id": null}', "missing"),
        (b'{"order_id": [1]}', "a list"),
        (b'{"order_id": true}', "a bool"),
        (b"[1, 2]", "a JSON list"),
    ],
)
def test_a_record_without_a_usable_idempotency_field_is_refused(value: bytes, problem: str) -> None:
    trigger = Trigger("shop.orders", idempotency_field="order_id")

    refusal = refused(submit(trigger, record(value)))

    assert refusal.reason == KEY_MISSING
    assert problem in refusal.detail


@pytest.mark.parametrize("value", [b"{not json", b"\xff\xfe", b"", None])
def test_a_value_the_decoder_cannot_read_is_refused_as_undecodable(value: bytes | None) -> None:
    refusal = refused(submit(Trigger("shop.orders"), record(value)))

    assert refusal.reason == DECODE_FAILED
    assert refusal.detail.startswith("TriggerDecodeError: ")


def test_rec_json_failing_inside_the_users_function_is_a_decode_failure() -> None:
    trigger = Trigger("raw.events", lambda rec: rec.json(), decoder="bytes")

    refusal = refused(submit(trigger, record(b"plain text"), decoder=RAW))

    assert refusal.reason == DECODE_FAILED


def test_a_users_function_that_raises_is_a_mapping_failure_with_its_text() -> None:
    trigger = Trigger("shop.orders", lambda rec: rec.json()["missing"])

    refusal = refused(submit(trigger, record(b'{"id": 1}')))

    assert refusal == TriggerRefusal(MAPPING_FAILED, "KeyError: 'missing'")


def test_a_users_function_that_returns_no_json_value_is_a_mapping_failure() -> None:
    trigger = Trigger("shop.orders", lambda rec: {"when": object()})

    refusal = refused(submit(trigger, record(b"{}")))

    assert refusal.reason == MAPPING_FAILED
    assert "not JSON-serializable" in refusal.detail


def test_raw_bytes_reach_the_function_undecoded() -> None:
    trigger = Trigger(
        "raw.events", lambda rec: {"text": rec.text(), "same": rec.decoded == rec.value}
    )

    command = submitted(submit(trigger, record(b"\x00plain"), decoder=RAW))

    assert json.loads(command.input) == {"text": "\x00plain", "same": True}


def test_a_plugged_in_decoder_feeds_the_function_and_the_idempotency_field() -> None:
    def upper_csv(value: bytes | None) -> dict[str, str]:
        order_id, status = (value or b"").decode().split(",")
        return {"order_id": order_id, "status": status.upper()}

    trigger = Trigger("csv.orders", idempotency_field="order_id", decoder="csv")
    command = submitted(submit(trigger, record(b"o-9,paid"), decoder=upper_csv))
    broken = refused(submit(trigger, record(b"no comma"), decoder=upper_csv))

    assert json.loads(command.input) == {"order_id": "o-9", "status": "PAID"}
    assert command.idempotency_key == json.dumps(["trigger", "orders", "field", "order_id", "o-9"])
    assert broken.reason == DECODE_FAILED and "ValueError" in broken.detail


def test_a_decoder_that_cannot_reach_its_registry_rejects_nothing() -> None:
    def unreachable(value: bytes | None) -> Any:
        raise TransportError("schema registry at http://registry: connection refused")

    with pytest.raises(TransportError, match="connection refused"):
        submit(Trigger("avro.orders", decoder="avro"), record(b"\x00\x00\x00\x00\x01"), unreachable)


def test_decoders_are_resolved_by_name_and_an_unknown_name_is_refused() -> None:
    declared = [("orders", Trigger("t", decoder="json")), ("raw", Trigger("t", decoder="bytes"))]
    bound = bind_triggers(declared, Settings(), BUILTIN_DECODERS)
    assert [b.decoder(b"[1]") for b in bound] == [[1], b"[1]"]

    with pytest.raises(ConfigurationError, match=r"decoder 'avro'.*offers bytes, json"):
        bind_triggers([("orders", Trigger("t", decoder="avro"))], Settings(), BUILTIN_DECODERS)
    plugged = {**BUILTIN_DECODERS, "avro": lambda settings: lambda value: {"avro": True}}
    (avro,) = bind_triggers([("orders", Trigger("t", decoder="avro"))], Settings(), plugged)
    assert avro.decoder(b"") == {"avro": True}


def test_pipelines_declare_triggers_by_argument_or_decorator() -> None:
    by_argument = Pipeline("a", trigger=processor.Trigger("shop.orders", idempotency_field="id"))
    by_argument.step()(lambda value: value)
    by_decorator = Pipeline("b")
    by_decorator.step()(lambda value: value)

    @by_decorator.trigger("shop.returns", decoder="bytes")
    def returned(rec: processor.TriggerRecord) -> dict[str, str]:
        return {"text": rec.text()}

    newer = Pipeline("b", version=2)
    newer.step()(lambda value: value)
    app = Application([by_argument, by_decorator])

    assert [(name, t.topic, t.idempotency_field) for name, t in app.triggers] == [
        ("a", "shop.orders", "id"),
        ("b", "shop.returns", None),
    ]
    assert app.triggers[1][1].to_input is returned
    # Submits start a pipeline's latest version, so only its triggers count.
    assert Application([by_decorator, newer]).triggers == []


def test_a_trigger_needs_a_topic_and_a_field_name_when_one_is_given() -> None:
    with pytest.raises(ConfigurationError):
        Trigger("")
    with pytest.raises(ConfigurationError):
        Trigger("shop.orders", idempotency_field="")
