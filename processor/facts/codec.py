"""Avro single-object encoding for every fact and message (fastavro).

A value is ``C3 01`` + the 8-byte little-endian CRC-64-AVRO fingerprint of the
writer schema's canonical form + the Avro binary body. Schemas are parsed once,
at import. Values written with an older schema (kept in ``schemas/history``)
still decode: the writer schema is found by fingerprint and resolved to the
current reader schema.

With a schema registry configured (``read_confluent``), values in the Confluent
wire format (``00`` + 4-byte big-endian schema id + the same Avro body) decode
too, once the transport edge has bound their schema id to a writer schema
(``bind_schema_id``); the codec itself never calls a registry. Without one, such
a value is ``malformed`` like any other that is not single-object.

Facts written with their current schema are decoded by a reader compiled from
that schema (``_compile_reader``): straight from the bytes, without a file object
or pydantic validation, into the very instance validation would build. Each
compiled reader is checked against the general path when the codec is built and
dropped if they differ; anything it does not handle (an unusual encoding, a
malformed value) goes the general way, which decides the result or the error.
"""

from __future__ import annotations

import json
import logging
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from io import BytesIO
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin

import fastavro

from processor.errors import FactDecodeError
from processor.facts.models import FACT_TYPES, MESSAGE_TYPES, AvroModel, FactHeader
from processor.facts.trusted import SLOT_SETTERS

__all__ = [
    "BODY_START",
    "CONFLUENT_HEADER_LEN",
    "SCHEMA_DIR",
    "SINGLE_OBJECT_MAGIC",
    "Codec",
    "codec",
    "crc64_avro",
    "decode",
    "decode_fact",
    "decode_facts",
    "encode",
    "encode_string",
    "fact_key_span",
    "string_span",
]

logger = logging.getLogger(__name__)

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"
_MAGIC = b"\xc3\x01"
_HEADER_LEN = 10
#: The first bytes of every single-object value.
SINGLE_OBJECT_MAGIC = _MAGIC
#: Where a value's Avro body begins: after the single-object marker and fingerprint.
BODY_START = _HEADER_LEN
_EMPTY64 = 0xC15D213AA4D7A795
#: The Confluent wire format: a zero byte, then the 4-byte big-endian schema id.
_CONFLUENT_MAGIC = b"\x00"
CONFLUENT_HEADER_LEN = 5

M = TypeVar("M", bound=AvroModel)


def _crc64_table() -> list[int]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_EMPTY64 & -(fp & 1))
        table.append(fp)
    return table


_CRC64_TABLE = _crc64_table()


def crc64_avro(data: bytes) -> bytes:
    """The Avro spec's 64-bit Rabin fingerprint, little-endian as on the wire."""
    fp = _EMPTY64
    for byte in data:
        fp = (fp >> 8) ^ _CRC64_TABLE[(fp ^ byte) & 0xFF]
    return fp.to_bytes(8, "little")


@dataclass(frozen=True, slots=True)
class _Entry:
    model: type[AvroModel]
    writer: Any
    reader: Any | None  # None when the writer schema is the current one
    validate: Callable[[Any], AvroModel]  # model.model_validate, minus a Python call layer
    fast: Callable[[bytes], AvroModel] | None = None  # see _compile_reader


def _validator(model: type[AvroModel]) -> Callable[[Any], AvroModel]:
    """``model.model_validate`` without keyword arguments is exactly its core
    validator's ``validate_python``; call that directly once the model is built."""
    if getattr(model, "__pydantic_complete__", False):
        validate: Callable[[Any], AvroModel] = model.__pydantic_validator__.validate_python
        return validate
    return model.model_validate


def _fingerprint(parsed: Any) -> bytes:
    canonical = fastavro.schema.to_parsing_canonical_form(parsed)
    return crc64_avro(canonical.encode())


class Codec:
    """Encodes models to single-object Avro and decodes them back."""

    def __init__(self, schema_dir: Path = SCHEMA_DIR) -> None:
        self._by_fingerprint: dict[bytes, _Entry] = {}
        self._header_by_model: dict[type[AvroModel], tuple[bytes, Any]] = {}
        self._model_by_name: dict[str, type[AvroModel]] = {}
        self._declared: dict[type[AvroModel], str] = {}
        # Confluent schema id -> the single-object header of its writer schema, or the
        # full name of a record that is none of ours.
        self._by_schema_id: dict[int, bytes | str] = {}
        #: Whether Confluent-framed values are read (a registry is configured).
        self.read_confluent = False
        for model in (*FACT_TYPES, *MESSAGE_TYPES):
            self._register(model, schema_dir)

    def _register(self, model: type[AvroModel], schema_dir: Path) -> None:
        declared = _load(schema_dir / f"{model.__name__}.avsc")
        current = fastavro.parse_schema(declared)
        fingerprint = _fingerprint(current)
        self._declared[model] = json.dumps(declared)
        self._header_by_model[model] = (_MAGIC + fingerprint, current)
        self._model_by_name[str(declared["namespace"]) + "." + str(declared["name"])] = model
        validate = _validator(model)
        entry = _Entry(model, current, None, validate)
        fast = _compile_reader(declared, model)
        if fast is not None and self._agrees(entry, fast, declared):
            entry = _Entry(model, current, None, validate, fast)
        self._by_fingerprint[fingerprint] = entry
        for old_path in sorted((schema_dir / "history").glob(f"{model.__name__}.*.avsc")):
            old = fastavro.parse_schema(_load(old_path))
            entry = _Entry(model, old, current, validate)
            self._by_fingerprint.setdefault(_fingerprint(old), entry)

    def _agrees(self, entry: _Entry, fast: Callable[[bytes], AvroModel], declared: Any) -> bool:
        """Whether ``fast`` decodes sample values exactly as the general path does."""
        header = self._header_by_model[entry.model][0]
        for sample in _samples(declared):
            out = BytesIO()
            out.write(header)
            fastavro.schemaless_writer(out, entry.writer, sample)
            raw = out.getvalue()
            try:
                if not _identical(fast(raw), self._decode_general(entry, raw)):
                    break
            except Exception:  # a reader that cannot decode its own samples is not used
                break
        else:
            return True
        logger.warning("codec: compiled reader of %s disagrees; not used", entry.model.__name__)
        return False

    def schema_of(self, model: type[AvroModel]) -> Any:
        """The parsed current schema of ``model``."""
        return self._header_by_model[model][1]

    def fingerprint_of(self, model: type[AvroModel]) -> bytes:
        return self._header_by_model[model][0][2:]

    def declared_schema(self, model: type[AvroModel]) -> str:
        """``model``'s current schema as declared (docs and defaults kept), as JSON."""
        return self._declared[model]

    def full_name_of(self, model: type[AvroModel]) -> str:
        """The Avro full name of ``model``'s record (``processor.facts.RunSubmitted``)."""
        name: str = self.schema_of(model)["name"]
        return name

    def model_of(self, fingerprint: bytes) -> type[AvroModel] | None:
        """The model whose schema (current or older) has ``fingerprint``, if any."""
        entry = self._by_fingerprint.get(fingerprint)
        return None if entry is None else entry.model

    def learn_writer(self, writer: Any) -> bytes | None:
        """Accept a writer schema this package did not ship with; return its fingerprint.

        Values written with it decode by Avro schema resolution to the current schema
        of the model with the same full name. None if no model has that name.
        """
        parsed = fastavro.parse_schema(writer)
        model = (
            self._model_by_name.get(parsed.get("name", "")) if isinstance(parsed, dict) else None
        )
        if model is None:
            return None
        fingerprint = _fingerprint(parsed)
        if fingerprint not in self._by_fingerprint:
            current = self.schema_of(model)
            self._by_fingerprint[fingerprint] = _Entry(model, parsed, current, _validator(model))
        return fingerprint

    def bind_schema_id(self, schema_id: int, writer: Any) -> None:
        """Decode Confluent-framed values of ``schema_id`` as written with ``writer``
        (once ``read_confluent`` is set)."""
        try:
            fingerprint = self.learn_writer(writer)
        except Exception:  # fastavro raises many types; a schema we cannot parse is not ours
            fingerprint = None
        if fingerprint is not None:
            self._by_schema_id[schema_id] = _MAGIC + fingerprint
        else:
            name = writer.get("name", "?") if isinstance(writer, dict) else str(writer)[:80]
            self._by_schema_id[schema_id] = str(name)

    def bound(self, schema_id: int) -> bool:
        """Whether ``schema_id`` is bound (``bind_schema_id``)."""
        return schema_id in self._by_schema_id

    def single_object_header(self, schema_id: int) -> bytes | None:
        """The single-object header equivalent to ``schema_id``'s, when it is ours."""
        bound = self._by_schema_id.get(schema_id)
        return bound if isinstance(bound, bytes) else None

    def encode(self, value: AvroModel) -> bytes:
        """Single-object encode ``value`` with its current schema."""
        header, schema = self._header_by_model[type(value)]
        out = BytesIO()
        out.write(header)
        fastavro.schemaless_writer(out, schema, _as_record(value))
        return out.getvalue()

    def decode(self, raw: bytes | None) -> AvroModel:
        """Decode any known value; raise FactDecodeError (keeping ``raw``) otherwise."""
        if raw is None or len(raw) < _HEADER_LEN or raw[:2] != _MAGIC:
            if self.read_confluent and raw is not None and raw[:1] == _CONFLUENT_MAGIC:
                return self._decode_confluent(raw)
            raise FactDecodeError("malformed", "not an Avro single-object value", raw)
        entry = self._by_fingerprint.get(raw[2:_HEADER_LEN])
        if entry is None:
            raise FactDecodeError("unknown_schema", "fingerprint not known to this processor", raw)
        if entry.fast is not None:
            try:
                return entry.fast(raw)
            except _NOT_FAST:
                pass  # not an encoding the compiled reader handles: the general path decides
        return self._decode_general(entry, raw)

    def _decode_confluent(self, raw: bytes) -> AvroModel:
        """Decode a Confluent-framed value; errors keep ``raw`` as it was read."""
        if len(raw) < CONFLUENT_HEADER_LEN:
            raise FactDecodeError("malformed", "shorter than a Confluent header", raw)
        schema_id = int.from_bytes(raw[1:CONFLUENT_HEADER_LEN], "big")
        bound = self._by_schema_id.get(schema_id)
        if bound is None:
            raise FactDecodeError("unknown_schema", f"schema id {schema_id} is not known", raw)
        if isinstance(bound, str):
            detail = f"schema id {schema_id} is {bound}, a record this processor does not read"
            raise FactDecodeError("wrong_schema", detail, raw)
        try:
            return self.decode(bound + raw[CONFLUENT_HEADER_LEN:])
        except FactDecodeError as exc:
            raise FactDecodeError(exc.reason, exc.detail, raw) from exc

    def _decode_general(self, entry: _Entry, raw: bytes) -> AvroModel:
        """fastavro and pydantic validation: the reference decoding of any value."""
        try:
            body = BytesIO(raw)
            body.seek(_HEADER_LEN)
            record = fastavro.schemaless_reader(body, entry.writer, entry.reader)
        except Exception as exc:  # fastavro raises many types on corrupt input
            raise FactDecodeError("malformed", f"{exc.__class__.__name__}: {exc}", raw) from exc
        if body.tell() != len(raw):
            raise FactDecodeError("malformed", "trailing bytes after the Avro body", raw)
        return _to_model(entry, record, raw)

    def decode_facts(self, values: Sequence[bytes | None]) -> list[FactHeader]:
        """``decode_as(value, FactHeader)`` of each value, in order (replay's hot loop).

        The compiled readers of the current fact schemas are called directly;
        every other value goes through ``decode_as``.
        """
        fast_by_fingerprint = self._fast_facts()
        get = fast_by_fingerprint.get
        decode_as = self.decode_as
        facts: list[FactHeader] = []
        append = facts.append
        for raw in values:
            fast = get(raw[2:_HEADER_LEN]) if raw is not None and raw[:2] == _MAGIC else None
            if fast is not None:
                try:
                    append(fast(raw))  # type: ignore[arg-type]
                    continue
                except _NOT_FAST:
                    pass  # the general path decides
            append(decode_as(raw, FactHeader))
        return facts

    def _fast_facts(self) -> dict[bytes, Callable[[bytes], AvroModel]]:
        """Fingerprint -> compiled reader, for the facts that have one."""
        return {
            fingerprint: entry.fast
            for fingerprint, entry in self._by_fingerprint.items()
            if entry.fast is not None and issubclass(entry.model, FactHeader)
        }

    def decode_as(self, raw: bytes | None, model: type[M]) -> M:
        """Decode and insist on one model type (FactDecodeError ``wrong_schema`` otherwise)."""
        value = self.decode(raw)
        if not isinstance(value, model):
            raise FactDecodeError(
                "wrong_schema", f"expected {model.__name__}, got {type(value).__name__}", raw
            )
        return value


def _to_model(entry: _Entry, record: Any, raw: bytes) -> AvroModel:
    # Validating is cheaper than model_construct in pydantic 2 and also builds nested models.
    try:
        return entry.validate(record)
    except ValueError as exc:
        raise FactDecodeError("malformed", str(exc), raw) from exc


class _NotFastError(Exception):
    """The compiled reader met an encoding it leaves to the general path."""


#: What makes the compiled reader give up: its own refusal, a value shorter than its
#: lengths say (IndexError), or a string that is not UTF-8.
_NOT_FAST = (_NotFastError, IndexError, UnicodeDecodeError)

#: Avro type -> the model annotations that validation leaves unchanged for its values
#: (an int stays the same int, a str the same str, ...); a nullable type allows ``| None``.
_PLAIN = {"string": str, "bytes": bytes, "int": int, "long": int, "boolean": bool}


def _annotation_fits(avro_type: Any, annotation: Any) -> bool:
    if isinstance(avro_type, str):
        return _PLAIN.get(avro_type) is annotation
    if isinstance(avro_type, list):
        if len(avro_type) != 2 or avro_type[0] != "null" or avro_type[1] not in _PLAIN:
            return False
        if get_origin(annotation) not in (Union, types.UnionType):
            return False
        return set(get_args(annotation)) == {_PLAIN[avro_type[1]], type(None)}
    if isinstance(avro_type, dict) and avro_type.get("type") == "array":
        return avro_type.get("items") in ("int", "long") and annotation == tuple[int, ...]
    return False


def _long_lines(target: str) -> list[str]:
    """Lines that read one zig-zag varint long into ``target``.

    Inline, as the hot loop is made of them; a varint longer than nine bytes (which
    fastavro wraps to 64 bits) is left to the general path.
    """
    return [
        "b = raw[pos]",
        "pos += 1",
        "if b < 128:",
        f"    {target} = (b >> 1) ^ -(b & 1)",
        "else:",
        "    n = b & 127",
        "    shift = 7",
        "    while True:",
        "        b = raw[pos]",
        "        pos += 1",
        "        n |= (b & 127) << shift",
        "        if b < 128:",
        "            break",
        "        shift += 7",
        "        if shift > 56:",
        "            raise _NotFastError",
        f"    {target} = (n >> 1) ^ -(n & 1)",
    ]


def _sized_lines(target: str, value: str) -> list[str]:
    """Lines that read a length-prefixed string or bytes into ``target``.

    A length past the end needs no check here: ``pos`` then ends beyond the value
    and the final ``pos != size`` (or the next ``raw[pos]``) hands it back.
    """
    return [
        "b = raw[pos]",
        "if b < 128 and not b & 1:",
        "    pos += 1",
        "    stop = pos + (b >> 1)",
        "else:",
        "    stop, pos = _length(raw, pos)",
        f"{target} = {value}",
        "pos = stop",
    ]


def _plain_lines(avro_type: str, target: str) -> list[str]:
    if avro_type in ("long", "int"):
        return _long_lines(target)
    if avro_type == "string":
        return _sized_lines(target, "raw[pos:stop].decode()")
    if avro_type == "bytes":
        return _sized_lines(target, "raw[pos:stop]")
    return [  # boolean: fastavro reads any non-zero byte as true; only 0 and 1 are ours
        "b = raw[pos]",
        "pos += 1",
        "if b == 1:",
        f"    {target} = True",
        "elif b == 0:",
        f"    {target} = False",
        "else:",
        "    raise _NotFastError",
    ]


def _field_lines(avro_type: Any, target: str) -> list[str]:
    """Lines that read one field's value into ``target``."""
    if isinstance(avro_type, str):
        return _plain_lines(avro_type, target)
    if isinstance(avro_type, list):  # ["null", T]: branch index 0 or 1, zig-zag encoded
        inner = ["    " + line for line in _plain_lines(avro_type[1], target)]
        branch = ["b = raw[pos]", "pos += 1", "if b == 0:", f"    {target} = None", "elif b == 2:"]
        return [*branch, *inner, "else:", "    raise _NotFastError"]
    return [  # an array of int/long: blocks of items, ended by an empty block
        "items = []",
        "while True:",
        *["    " + line for line in _long_lines("count")],
        "    if count == 0:",
        "        break",
        "    if count < 0:",
        "        raise _NotFastError",  # a block with its byte size: the general path
        "    for _ in range(count):",
        *["        " + line for line in _long_lines("item")],
        "        items.append(item)",
        f"{target} = tuple(items)",
    ]


def _unsigned(raw: bytes, pos: int) -> tuple[int, int]:
    """An unsigned varint of at most nine bytes at ``pos``; (value, position after it).

    Longer ones (which fastavro wraps to 64 bits) are left to the general path.
    """
    result = shift = 0
    while shift < 63:
        byte = raw[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
    raise _NotFastError


def _long(raw: bytes, pos: int) -> tuple[int, int]:
    """A zig-zag varint long at ``pos``; (value, position after it)."""
    n, pos = _unsigned(raw, pos)
    return (n >> 1) ^ -(n & 1), pos


def _length(raw: bytes, pos: int) -> tuple[int, int]:
    """A string or bytes length at ``pos``; (end of the content, start of the content)."""
    n, pos = _long(raw, pos)
    if n < 0:
        raise _NotFastError  # the general path refuses it
    return pos + n, pos


def string_span(raw: bytes, pos: int) -> tuple[int, int]:
    """(start, end) of the Avro string whose length is at ``raw[pos]``, without decoding
    anything else: every fact begins with its run id, a string, at ``BODY_START``.

    Raises ValueError if no length (at most nine bytes, not negative) is there.
    """
    try:
        length = raw[pos]
        if length < 0x80 and not length & 1:  # one byte, as a length mostly is
            return pos + 1, pos + 1 + (length >> 1)
        end, start = _length(raw, pos)
    except _NOT_FAST as exc:
        raise ValueError(f"no Avro string length at {pos}") from exc
    return start, end


def fact_key_span(raw: bytes, seq_at: int) -> tuple[int, int]:
    """(start, end) of the fact key of an encoded fact whose seq is at ``raw[seq_at]``:
    every fact header is run id, seq, fact key. Raises ValueError as ``string_span``."""
    key_at = seq_at
    try:  # the seq's value is not needed, only its end: a varint of up to ten bytes
        while raw[key_at] > 0x7F and key_at - seq_at < 9:
            key_at += 1
        if raw[key_at] > 0x7F:
            raise ValueError(f"no Avro long at {seq_at}")
    except IndexError as exc:
        raise ValueError(f"no Avro long at {seq_at}") from exc
    return string_span(raw, key_at + 1)


def encode_string(text: str) -> bytes:
    """``text`` as Avro writes a string: its length as a zig-zag varint, then UTF-8."""
    raw = text.encode()
    length = bytearray()
    number = len(raw) << 1
    while number > 0x7F:
        length.append(number & 0x7F | 0x80)
        number >>= 7
    length.append(number)
    return bytes(length) + raw


def _compile_reader(schema: Any, model: type[AvroModel]) -> Callable[[bytes], AvroModel] | None:
    """A reader of single-object values written with ``schema``, or None if not eligible.

    Eligible: a flat record whose fields are strings, bytes, ints, longs, booleans,
    ``["null", one of those]`` or arrays of ints, in the model's field order, each
    annotated with the type validation leaves as it is and without constraints.
    The reader builds the model the way validation does (``__dict__`` in field
    order, every field set, no extra, no private) without validating.
    """
    fields = schema.get("fields") if isinstance(schema, dict) else None
    names = [field["name"] for field in fields or ()]
    setters = SLOT_SETTERS
    if not fields or names != list(model.model_fields) or setters is None:
        return None
    if model.__pydantic_post_init__ or model.__pydantic_root_model__:
        return None
    if model.model_config.get("extra") == "allow":
        return None
    for field in fields:
        info = model.model_fields[field["name"]]
        if info.metadata or not _annotation_fits(field["type"], info.annotation):
            return None
    lines = ["def read(raw):", "    size = len(raw)", f"    pos = {_HEADER_LEN}"]
    for index, field in enumerate(fields):
        lines += ["    " + line for line in _field_lines(field["type"], f"v{index}")]
    values = ", ".join(f"{name!r}: v{index}" for index, name in enumerate(names))
    lines += [
        "    if pos != size:",
        "        raise _NotFastError",  # short or trailing bytes: the general path decides
        "    instance = _new(_model)",
        f"    _set_dict(instance, {{{values}}})",
        "    _set_fields_set(instance, _names.copy())",
        "    _set_extra(instance, None)",
        "    _set_private(instance, None)",
        "    return instance",
    ]
    namespace: dict[str, Any] = {
        "_NotFastError": _NotFastError,
        "_long": _long,
        "_length": _length,
        "_new": object.__new__,
        "_set_dict": setters["__dict__"],
        "_set_fields_set": setters["__pydantic_fields_set__"],
        "_set_extra": setters["__pydantic_extra__"],
        "_set_private": setters["__pydantic_private__"],
        "_model": model,
        "_names": set(names),
    }
    exec(compile("\n".join(lines), f"<codec reader {model.__name__}>", "exec"), namespace)
    reader: Callable[[bytes], AvroModel] = namespace["read"]
    return reader


def _samples(schema: Any) -> list[dict[str, Any]]:
    """Records exercising every field of a flat schema: nulls, and values of every size."""
    plain: dict[str, list[Any]] = {
        "string": ["", "run-\u00e9-\U0001f600" * 9],
        "bytes": [b"", bytes(range(256))],
        "int": [0, -(2**31)],
        "long": [-1, 2**62 - 1],
        "boolean": [False, True],
    }
    out = []
    for variant in (0, 1):
        record: dict[str, Any] = {}
        for field in schema["fields"]:
            kind = field["type"]
            if isinstance(kind, list):
                record[field["name"]] = None if variant == 0 else plain[kind[1]][variant]
            elif isinstance(kind, dict):
                record[field["name"]] = [] if variant == 0 else [1, -300, 2**40, 0]
            else:
                record[field["name"]] = plain[kind][variant]
        out.append(record)
    return out


def _identical(left: AvroModel, right: AvroModel) -> bool:
    """Same type, same field values of the same types in the same order, same state."""
    return (
        type(left) is type(right)
        and list(left.__dict__.items()) == list(right.__dict__.items())
        and all(
            type(a) is type(b)
            for a, b in zip(left.__dict__.values(), right.__dict__.values(), strict=True)
        )
        and left.__pydantic_fields_set__ == right.__pydantic_fields_set__
        and type(left.__pydantic_fields_set__) is type(right.__pydantic_fields_set__)
        and left.__pydantic_extra__ == right.__pydantic_extra__
        and left.__pydantic_private__ == right.__pydantic_private__
    )


def _as_record(value: AvroModel) -> dict[str, Any]:
    record = dict(value.__dict__)
    for name, item in record.items():
        if isinstance(item, tuple):
            record[name] = [x.__dict__ if isinstance(x, AvroModel) else x for x in item]
    return record


def _load(path: Path) -> Any:
    return json.loads(path.read_text())


@cache
def codec() -> Codec:
    """The process-wide codec (schemas parsed once)."""
    return Codec()


def encode(value: AvroModel) -> bytes:
    return codec().encode(value)


def decode(raw: bytes | None) -> AvroModel:
    return codec().decode(raw)


def decode_fact(raw: bytes | None) -> FactHeader:
    return codec().decode_as(raw, FactHeader)


def decode_facts(values: Sequence[bytes | None]) -> list[FactHeader]:
    """``decode_fact`` of each value, in order."""
    return codec().decode_facts(values)
