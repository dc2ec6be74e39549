"""The ``avro`` trigger decoder: Confluent-framed Avro records of a user's topic.

A record is ``00`` + a 4-byte big-endian schema id + the Avro body, as any
Confluent ``AvroSerializer`` writes it; the writer schema comes from the registry
of the deployment's settings (``PROCESSOR_SCHEMA_REGISTRY_URL`` and its auth and
TLS settings) and is cached by id, so the registry is asked once per schema.

What is whose fault:

- a record that is not framed, names a schema id the registry does not know, or
  whose body does not decode raises ``ValueError`` (or the deserializer's own
  error): the trigger refuses it ``trigger_decode_failed``;
- a registry that does not answer (or answers with anything but "not found")
  raises ``RegistryUnavailableError``, a ``TransportError``: the record is fine,
  and the trigger stage waits and reads the batch again.
"""

from __future__ import annotations

import weakref
from typing import Any

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from processor.config.settings import Settings, schema_registry_config
from processor.errors import RegistryUnavailableError

__all__ = ["RegistryAvroDecoder", "avro_decoder"]

_HEADER_LEN = 5  # the magic byte and the schema id
_CLIENT_DEFAULTS = {"timeout": 5, "max.retries": 0}  # the stage retries, with backoff
_NOT_FOUND = frozenset({40401, 40402, 40403})
# The deserializer needs a context only for subject-based lookups, which it does not make.
_CONTEXT = SerializationContext("", MessageField.VALUE)


class RegistryAvroDecoder:
    """``value -> dict``: decodes Confluent-framed Avro with writer schemas from a registry."""

    def __init__(self, config: dict[str, Any]) -> None:
        self._client = SchemaRegistryClient(dict(_CLIENT_DEFAULTS) | config)
        # Lives as long as the trigger stage; its HTTP connections close with it.
        weakref.finalize(self, self._client.close)
        self._deserializer = AvroDeserializer(self._client)
        self._fetched: set[int] = set()

    def __call__(self, value: bytes | None) -> Any:
        if value is None:
            raise ValueError("the record has no value (a tombstone)")
        if len(value) < _HEADER_LEN or value[0] != 0:
            raise ValueError("not Confluent-framed Avro (magic byte 00 and a 4-byte schema id)")
        schema_id = int.from_bytes(value[1:_HEADER_LEN], "big")
        if schema_id not in self._fetched:
            self._fetch(schema_id)  # the client caches it: the deserializer asks no more
            self._fetched.add(schema_id)
        return self._deserializer(value, _CONTEXT)

    def _fetch(self, schema_id: int) -> None:
        try:
            self._client.get_schema(schema_id)
        except SchemaRegistryError as exc:
            if exc.error_code in _NOT_FOUND or exc.http_status_code == 404:
                raise ValueError(f"schema id {schema_id} is not in the registry") from exc
            raise RegistryUnavailableError(
                f"schema registry: get schema {schema_id}: {exc}"
            ) from exc
        except Exception as exc:  # the HTTP client's connection errors and timeouts
            detail = f"{type(exc).__name__}: {exc}"
            raise RegistryUnavailableError(
                f"schema registry: get schema {schema_id}: {detail}"
            ) from exc


def avro_decoder(settings: Settings) -> RegistryAvroDecoder:
    """The decoder factory of ``decoder="avro"``; a ConfigurationError without a registry."""
    return RegistryAvroDecoder(schema_registry_config(settings))
