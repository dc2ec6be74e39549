"""Every model round-trips through its Avro schema; models and schemas agree."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.errors import FactDecodeError
from processor.facts.codec import BODY_START, codec, crc64_avro, fact_key_span, string_span
from processor.facts.models import (
    FACT_TYPES,
    MESSAGE_TYPES,
    AvroModel,
    FactHeader,
    Rejected,
    RunSucceeded,
)
from processor.facts.rejection import rejected
from processor.transport.base import Record

ALL_MODELS = (*FACT_TYPES, *MESSAGE_TYPES)


def strategy_for(avro_type: Any) -> st.SearchStrategy[Any]:
    """A hypothesis strategy producing Python values valid for an Avro type."""
    if isinstance(avro_type, list):
        return st.one_of(*(strategy_for(t) for t in avro_type))
    if isinstance(avro_type, dict):
        kind = avro_type["type"]
        if kind == "array":
            return st.lists(strategy_for(avro_type["items"]), max_size=4)
        if kind == "map":
            values = strategy_for(avro_type["values"])
            return st.dictionaries(st.text(max_size=8), values, max_size=3)
        if kind == "enum":
            return st.sampled_from(avro_type["symbols"])
        if kind == "record":
            return st.fixed_dictionaries(
                {f["name"]: strategy_for(f["type"]) for f in avro_type["fields"]}
            )
        return strategy_for(kind)
    scalars: dict[str, st.SearchStrategy[Any]] = {
        "null": st.none(),
        "boolean": st.booleans(),
        "int": st.integers(-(2**31), 2**31 - 1),
        "long": st.integers(-(2**63), 2**63 - 1),
        "string": st.text(max_size=20),
        "bytes": st.binary(max_size=32),
    }
    return scalars[avro_type]


def model_strategy(model: type[AvroModel]) -> st.SearchStrategy[AvroModel]:
    schema = codec().schema_of(model)
    fields = {f["name"]: strategy_for(f["type"]) for f in schema["fields"]}
    return st.fixed_dictionaries(fields).map(model.model_validate)


@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda m: m.__name__)
def test_model_fields_mirror_the_schema(model: type[AvroModel]) -> None:
    schema = codec().schema_of(model)
    assert [f["name"] for f in schema["fields"]] == list(model.model_fields)
    for field in schema["fields"]:
        nullable = isinstance(field["type"], list) and "null" in field["type"]
        required = model.model_fields[field["name"]].is_required()
        assert required == ("default" not in field), field["name"]
        if nullable:
            assert model.model_fields[field["name"]].default is None


@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda m: m.__name__)
def test_decode_encode_round_trip(model: type[AvroModel]) -> None:
    @given(model_strategy(model))
    @settings(max_examples=50)
    def check(value: AvroModel) -> None:
        raw = codec().encode(value)
        assert raw[:2] == b"\xc3\x01"
        assert raw[2:10] == codec().fingerprint_of(model)
        assert codec().decode(raw) == value

    check()


@pytest.mark.parametrize("model", FACT_TYPES, ids=lambda m: m.__name__)
def test_the_header_spans_find_the_run_id_and_the_fact_key(model: type[FactHeader]) -> None:
    @given(model_strategy(model))
    @settings(max_examples=30)
    def check(fact: AvroModel) -> None:
        assert isinstance(fact, FactHeader)
        raw = codec().encode(fact)
        start, end = string_span(raw, BODY_START)
        assert raw[start:end].decode() == fact.run_id
        key_at, key_end = fact_key_span(raw, end)
        assert raw[key_at:key_end].decode() == fact.fact_key

    check()


def test_a_span_that_cannot_be_read_is_an_error() -> None:
    with pytest.raises(ValueError, match="no Avro string length"):
        string_span(b"\xff" * 12, 0)  # a varint that never ends
    with pytest.raises(ValueError, match="no Avro string length"):
        string_span(b"\x01", 0)  # a negative length
    with pytest.raises(ValueError, match="no Avro long"):
        fact_key_span(b"\xff" * 12, 0)  # a seq of more than ten bytes
    with pytest.raises(ValueError, match="no Avro long"):
        fact_key_span(b"\xff\xff", 0)  # a seq cut short


def test_facts_share_the_header_fields() -> None:
    header = list(FactHeader.model_fields)
    for model in FACT_TYPES:
        assert [f["name"] for f in codec().schema_of(model)["fields"]][: len(header)] == header


def test_crc64_matches_the_avro_specification_vector() -> None:
    # Java's SchemaNormalization.parsingFingerprint64 of the schema "null" is
    # 0x63dd24e7cc258f8a; single-object encoding writes it little-endian.
    assert int.from_bytes(crc64_avro(b'"null"'), "little") == 0x63DD24E7CC258F8A


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (None, "malformed"),
        (b"", "malformed"),
        (b"garbage that is long enough", "malformed"),
        (b"\xc3\x01" + b"\x00" * 8 + b"body", "unknown_schema"),
    ],
)
def test_undecodable_values_are_refused_with_a_reason(raw: bytes | None, reason: str) -> None:
    with pytest.raises(FactDecodeError) as caught:
        codec().decode(raw)
    assert caught.value.reason.startswith(reason)
    assert caught.value.raw == raw
    # The reason and the detail are separate fields; the message joins them.
    assert caught.value.reason == reason
    assert caught.value.detail and not caught.value.detail.startswith(reason)
    assert str(caught.value) == f"{reason}: {caught.value.detail}"


def test_truncated_and_padded_bodies_are_malformed() -> None:
    fact = RunSucceeded(run_id="r", seq=1, fact_key="k", time_ms=1, cause_id="c", result=b"{}")
    raw = codec().encode(fact)
    for broken in (raw[:-3], raw + b"\x00"):
        with pytest.raises(FactDecodeError) as caught:
            codec().decode(broken)
        assert caught.value.reason.startswith("malformed")


def test_decode_as_refuses_the_wrong_schema() -> None:
    fact = RunSucceeded(run_id="r", seq=1, fact_key="k", time_ms=1, cause_id="c", result=b"{}")
    from processor.facts.models import SubmitRun

    with pytest.raises(FactDecodeError) as caught:
        codec().decode_as(codec().encode(fact), SubmitRun)
    assert caught.value.reason.startswith("wrong_schema")
    assert caught.value.detail == "expected SubmitRun, got RunSucceeded"


def test_a_rejection_keeps_the_refused_record_and_its_reason() -> None:
    record = Record("runs.commands", 2, 17, b"run-1", b"\x00garbage")
    refusal = rejected(record, "malformed", "not an Avro single-object value", 1234, run_id="r")
    assert refusal == Rejected(
        reason="malformed",
        detail="not an Avro single-object value",
        source_topic="runs.commands",
        source_partition=2,
        source_offset=17,
        original_key=b"run-1",
        original_value=b"\x00garbage",
        run_id="r",
        rejected_ms=1234,
    )
    assert codec().decode_as(codec().encode(refusal), Rejected) == refusal
