"""The Confluent wire format: the codec's side (pure) and the transport edge (a fake registry)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from io import BytesIO
from typing import Any

import fastavro
import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.error import SchemaRegistryError
from hypothesis import given, settings

from processor.errors import FactDecodeError, RegistryUnavailableError, SchemaRefusedError
from processor.facts.codec import BODY_START, SCHEMA_DIR, Codec, codec
from processor.facts.models import FACT_TYPES, MESSAGE_TYPES, AvroModel, SubmitRun
from processor.transport import schema_ids
from processor.transport.base import Outbound, Record, TopicPartition
from processor.transport.registry import RegistryTransport
from processor.transport.schema_ids import SchemaIds, subject_name
from tests.unit.test_codec import model_strategy

ALL_MODELS = (*FACT_TYPES, *MESSAGE_TYPES)


def _confluent(schema_id: int, single_object: bytes) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + single_object[BODY_START:]


@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda m: m.__name__)
def test_a_bound_schema_id_decodes_as_the_single_object_value(model: type[AvroModel]) -> None:
    local = Codec()
    local.read_confluent = True
    local.bind_schema_id(40 + ALL_MODELS.index(model), json.loads(local.declared_schema(model)))

    @given(model_strategy(model))
    @settings(max_examples=20)
    def check(value: AvroModel) -> None:
        raw = local.encode(value)
        assert local.decode(_confluent(40 + ALL_MODELS.index(model), raw)) == value

    check()


def _submit() -> SubmitRun:
    return SubmitRun(
        command_id="c1", run_id="r1", pipeline="p", input=b"{}", submitted_ms=5, deadline_ms=None
    )


def test_unknown_ids_foreign_records_and_bad_bodies_are_refused_with_the_bytes_read() -> None:
    local = Codec()
    body = local.encode(_submit())
    unknown = _confluent(9, body)
    with pytest.raises(FactDecodeError) as refused:
        local.decode(unknown)
    assert refused.value.reason == "malformed"  # no registry: only single-object values
    local.read_confluent = True
    with pytest.raises(FactDecodeError) as refused:
        local.decode(unknown)
    assert (refused.value.reason, refused.value.raw) == ("unknown_schema", unknown)

    local.bind_schema_id(10, {"type": "record", "name": "Order", "namespace": "x", "fields": []})
    foreign = b"\x00\x00\x00\x00\x0a"
    with pytest.raises(FactDecodeError) as refused:
        local.decode(foreign)
    assert (refused.value.reason, refused.value.raw) == ("wrong_schema", foreign)

    unparseable = {"type": "record", "name": "Bad", "fields": [{"name": "x", "type": "nope"}]}
    local.bind_schema_id(12, unparseable)
    with pytest.raises(FactDecodeError) as refused:
        local.decode(b"\x00\x00\x00\x00\x0c")
    assert refused.value.reason == "wrong_schema"

    local.bind_schema_id(11, json.loads(local.declared_schema(SubmitRun)))
    truncated = _confluent(11, body)[:-3]
    with pytest.raises(FactDecodeError) as refused:
        local.decode(truncated)
    assert (refused.value.reason, refused.value.raw) == ("malformed", truncated)


def test_older_and_newer_writer_schemas_from_the_registry_decode_by_resolution() -> None:
    # The oldest kept version: the one with the fewest fields (versions add optional ones).
    kept = [json.loads(p.read_text()) for p in (SCHEMA_DIR / "history").glob("SubmitRun.*.avsc")]
    older = min(kept, key=lambda schema: len(schema["fields"]))
    local = Codec()
    local.read_confluent = True
    local.bind_schema_id(3, older)
    out = BytesIO()
    record = {k: v for k, v in _submit().model_dump().items() if k != "deadline_ms"}
    fastavro.schemaless_writer(out, fastavro.parse_schema(older), record)
    decoded = local.decode(b"\x00\x00\x00\x00\x03" + out.getvalue())
    assert decoded == _submit()

    # A newer writer (a team that added a field) decodes too: the field is skipped.
    newer = json.loads(local.declared_schema(SubmitRun))
    newer["fields"].append({"name": "priority", "type": "int", "default": 0})
    local.bind_schema_id(4, newer)
    out = BytesIO()
    fastavro.schemaless_writer(
        out, fastavro.parse_schema(newer), {**_submit().model_dump(), "priority": 7}
    )
    assert local.decode(b"\x00\x00\x00\x00\x04" + out.getvalue()) == _submit()


class FakeRegistry:
    """Answers like a registry; ``down`` makes every call fail as a refused connection."""

    def __init__(self) -> None:
        self.schemas: dict[int, str] = {}
        self.subjects: dict[str, int] = {}
        self.calls = 0
        self.down = False
        self.refuse = False

    def _answer(self) -> None:
        self.calls += 1
        if self.down:
            raise ConnectionRefusedError("registry down")
        if self.refuse:
            raise SchemaRegistryError(409, 409, "Incompatible schema")

    def register_schema(self, subject: str, schema: Schema) -> int:
        self._answer()
        ids = {text: i for i, text in self.schemas.items()}
        schema_id = ids.get(schema.schema_str or "") or 1000 + len(self.schemas)
        self.schemas[schema_id] = schema.schema_str or ""
        self.subjects[subject] = schema_id
        return schema_id

    def get_schema(self, schema_id: int) -> Schema:
        self._answer()
        if schema_id not in self.schemas:
            raise SchemaRegistryError(404, 40403, "Schema not found")
        return Schema(self.schemas[schema_id], "AVRO")


def _ids(registry: FakeRegistry, values: Codec | None = None) -> SchemaIds:
    ids = SchemaIds({"url": "http://registry.invalid"}, Codec() if values is None else values)
    ids._client = registry  # type: ignore[assignment]
    return ids


def test_produce_reframes_our_records_once_per_topic_and_leaves_others_alone() -> None:
    registry = FakeRegistry()
    ids = _ids(registry)
    value = codec().encode(_submit())
    framed = ids.confluent("t.commands", value)
    schema_id = registry.subjects[subject_name("t.commands", SubmitRun)]
    assert framed == _confluent(schema_id, value)
    assert subject_name("t.commands", SubmitRun) == "t.commands-processor.messages.SubmitRun"
    for _ in range(3):
        assert ids.confluent("t.commands", value) == framed
    assert registry.calls == 1  # cached: no registry call per record
    assert ids.confluent("t.out", b'{"json": 1}') == b'{"json": 1}'
    assert ids.single_object(framed) == value  # and back, for readers


def test_registry_failures_are_translated_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schema_ids, "_RETRY_S", 0.05)
    registry = FakeRegistry()
    ids = _ids(registry)
    registry.down = True
    with pytest.raises(RegistryUnavailableError):
        ids.confluent("t.commands", codec().encode(_submit()))
    assert registry.calls >= 2  # retried before giving up
    registry.down, registry.refuse = False, True
    with pytest.raises(SchemaRefusedError, match="Incompatible"):
        ids.register("t.commands", SubmitRun)


class FakeSession:
    def __init__(self, records: list[Record]) -> None:
        self.batches = [records]
        self.produced: list[Outbound] = []

    def poll(self, max_records: int, timeout_s: float) -> list[Record]:
        return self.batches.pop(0) if self.batches else []

    def produce(self, record: Outbound) -> None:
        self.produced.append(record)

    def subscribe(self, *args: Any) -> None: ...
    def begin(self) -> None: ...
    def commit(self, consumed: Mapping[TopicPartition, int]) -> list[Any]:
        return []

    def abort(self) -> None: ...
    def close(self) -> None: ...


class FakeTransport:
    name = "fake"

    def __init__(self, session: FakeSession) -> None:
        self._session = session

    def session(self, group: str, instance_id: str) -> FakeSession:
        return self._session


def test_records_polled_while_the_registry_is_down_are_handed_out_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(schema_ids, "_RETRY_S", 0.05)
    registry = FakeRegistry()
    schema_id = registry.register_schema("s", Schema(codec().declared_schema(SubmitRun), "AVRO"))
    late_id = 2**31 - 100  # bound on the first poll that reaches the registry
    framed = _confluent(late_id, codec().encode(_submit()))
    registry.schemas[late_id] = registry.schemas[schema_id]
    record = Record("t.commands", 0, 5, b"r1", framed)
    inner = FakeSession([record])
    local = Codec()
    session = RegistryTransport(FakeTransport(inner), _ids(registry, local)).session("g", "i")  # type: ignore[arg-type]
    registry.down = True
    with pytest.raises(RegistryUnavailableError):
        session.poll(10, 0.1)
    registry.down = False
    assert session.poll(10, 0.1) == [record]  # the same bytes, kept for a refusal
    assert local.decode(record.value) == _submit()
    session.produce(Outbound("t.facts", b"r1", codec().encode(_submit())))
    assert inner.produced[0].value[:1] == b"\x00"
