"""Avro single-object encoding for every fact and message (fastavro).

A value is ``C3 01`` + the 8-byte little-endian CRC-64-AVRO fingerprint of the
writer schema's canonical form + the Avro binary body. Schemas are parsed once,
at import. Values written with an older schema (kept in ``schemas/history``)
still decode: the writer schema is found by fingerprint and resolved to the
current reader schema.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from io import BytesIO
from pathlib import Path
from typing import Any, TypeVar

import fastavro

from processor.errors import FactDecodeError
from processor.facts.models import FACT_TYPES, MESSAGE_TYPES, AvroModel, FactHeader

__all__ = [
    "SCHEMA_DIR",
    "Codec",
    "codec",
    "crc64_avro",
    "decode",
    "decode_fact",
    "encode",
]

logger = logging.getLogger(__name__)

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"
_MAGIC = b"\xc3\x01"
_HEADER_LEN = 10
_EMPTY64 = 0xC15D213AA4D7A795

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
        for model in (*FACT_TYPES, *MESSAGE_TYPES):
            self._register(model, schema_dir)

    def _register(self, model: type[AvroModel], schema_dir: Path) -> None:
        current = fastavro.parse_schema(_load(schema_dir / f"{model.__name__}.avsc"))
        fingerprint = _fingerprint(current)
        self._header_by_model[model] = (_MAGIC + fingerprint, current)
        validate = _validator(model)
        self._by_fingerprint[fingerprint] = _Entry(model, current, None, validate)
        for old_path in sorted((schema_dir / "history").glob(f"{model.__name__}.*.avsc")):
            old = fastavro.parse_schema(_load(old_path))
            entry = _Entry(model, old, current, validate)
            self._by_fingerprint.setdefault(_fingerprint(old), entry)

    def schema_of(self, model: type[AvroModel]) -> Any:
        """The parsed current schema of ``model``."""
        return self._header_by_model[model][1]

    def fingerprint_of(self, model: type[AvroModel]) -> bytes:
        return self._header_by_model[model][0][2:]

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
            raise FactDecodeError("malformed: not an Avro single-object value", raw)
        entry = self._by_fingerprint.get(raw[2:_HEADER_LEN])
        if entry is None:
            raise FactDecodeError("unknown_schema: fingerprint not known to this processor", raw)
        try:
            body = BytesIO(raw)
            body.seek(_HEADER_LEN)
            record = fastavro.schemaless_reader(body, entry.writer, entry.reader)
        except Exception as exc:  # fastavro raises many types on corrupt input
            raise FactDecodeError(f"malformed: {exc.__class__.__name__}: {exc}", raw) from exc
        if body.tell() != len(raw):
            raise FactDecodeError("malformed: trailing bytes after the Avro body", raw)
        return _to_model(entry, record, raw)

    def decode_as(self, raw: bytes | None, model: type[M]) -> M:
        """Decode and insist on one model type (FactDecodeError ``wrong_schema`` otherwise)."""
        value = self.decode(raw)
        if not isinstance(value, model):
            raise FactDecodeError(
                f"wrong_schema: expected {model.__name__}, got {type(value).__name__}", raw
            )
        return value


def _to_model(entry: _Entry, record: Any, raw: bytes) -> AvroModel:
    # Validating is cheaper than model_construct in pydantic 2 and also builds nested models.
    try:
        return entry.validate(record)
    except ValueError as exc:
        raise FactDecodeError(f"malformed: {exc}", raw) from exc


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
