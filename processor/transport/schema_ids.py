"""Confluent schema ids, from a Schema Registry, cached: the wire format's only I/O.

Subjects follow TopicRecordNameStrategy, ``<physical topic>-<record full name>``
(``runs.facts-processor.facts.RunSubmitted``), so one topic carries several record
types, each with its own compatibility history. Every registry call goes through
``SchemaIds._call``: registry errors are translated there and nowhere else (an
unreachable registry is a ``RegistryUnavailableError``, retried like the log's
own failures; a refusal is a ``SchemaRefusedError`` with the registry's answer).

After warm-up nothing here calls the registry: ids of (topic, fingerprint) and
the writer schemas of ids read are cached for the life of the process (a schema
id never changes meaning in a registry).
"""

from __future__ import annotations

import json
import logging
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from processor.errors import RegistryUnavailableError, SchemaRefusedError
from processor.facts.codec import (
    BODY_START,
    CONFLUENT_HEADER_LEN,
    SINGLE_OBJECT_MAGIC,
    Codec,
    codec,
)
from processor.facts.models import AvroModel

__all__ = ["SchemaIds", "subject_name"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: How long one registry call is retried (with backoff) before the caller sees
#: ``RegistryUnavailableError``; the processor then waits and resumes as after a
#: broker outage.
_RETRY_S = 3.0
_FIRST_PAUSE_S = 0.1
_MAX_PAUSE_S = 1.0
#: Per request; the client retries nothing itself (we do, above).
_CLIENT_DEFAULTS = {"timeout": 5, "max.retries": 0}
#: Registry answers that mean "no such schema id / subject".
_NOT_FOUND = frozenset({40401, 40402, 40403})
_CONFLUENT_MAGIC = b"\x00"


def subject_name(topic: str, model: type[AvroModel]) -> str:
    """The subject of ``model``'s values on ``topic`` (TopicRecordNameStrategy)."""
    return f"{topic}-{codec().full_name_of(model)}"


class SchemaIds:
    """Turns single-object headers into Confluent ones and back, through a registry.

    Binds ids in ``values`` (the process-wide codec by default), which from now on
    reads Confluent-framed values. Picklable (the client is made again on first
    use in another process).
    """

    def __init__(self, config: dict[str, Any], values: Codec | None = None) -> None:
        self._codec = codec() if values is None else values
        self._codec.read_confluent = True
        self._config = dict(_CLIENT_DEFAULTS) | dict(config)
        self._client: SchemaRegistryClient | None = None
        self._ids: dict[tuple[str, bytes], int] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self._config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["config"])  # type: ignore[misc]

    @property
    def client(self) -> SchemaRegistryClient:
        """The registry client (made on first use)."""
        if self._client is None:
            self._client = SchemaRegistryClient(self._config)
            # Lives as long as the transport; its HTTP connections close with it.
            weakref.finalize(self, self._client.close)
        return self._client

    def close(self) -> None:
        """Close the registry client's connections (a later call opens new ones)."""
        client, self._client = self._client, None
        if client is not None:
            client.close()

    # --- produce ---------------------------------------------------------------------------

    def confluent(self, topic: str, value: bytes) -> bytes:
        """``value`` in the Confluent framing if it is one of ours in single-object form."""
        if value[:2] != SINGLE_OBJECT_MAGIC or len(value) < BODY_START:
            return value  # not a record of ours (a user's JSON output, say): as it is
        fingerprint = value[2:BODY_START]
        schema_id = self._ids.get((topic, fingerprint))
        if schema_id is None:
            schema_id = self._register(topic, fingerprint)
            if schema_id is None:
                return value
        return _CONFLUENT_MAGIC + schema_id.to_bytes(4, "big") + value[BODY_START:]

    def _register(self, topic: str, fingerprint: bytes) -> int | None:
        model = self._codec.model_of(fingerprint)
        if model is None or self._codec.fingerprint_of(model) != fingerprint:
            return None  # not written with a current schema of ours: left as it is
        schema_id = self.register(topic, model)
        self._ids[(topic, fingerprint)] = schema_id
        return schema_id

    def register(self, topic: str, model: type[AvroModel]) -> int:
        """Register ``model``'s current schema under its subject of ``topic``; its id."""
        subject = subject_name(topic, model)
        schema = Schema(self._codec.declared_schema(model), "AVRO")
        return self._call(f"register {subject}", lambda c: c.register_schema(subject, schema))

    def set_compatibility(self, subject: str, level: str) -> None:
        """Set ``subject``'s compatibility level (``BACKWARD``...)."""
        self._call(
            f"set compatibility of {subject}",
            lambda c: c.set_compatibility(subject_name=subject, level=level),
        )

    # --- consume ---------------------------------------------------------------------------

    def bind(self, value: bytes | None) -> None:
        """Make the codec able to decode ``value`` if it is Confluent-framed.

        An id the registry does not know stays unbound: the codec then refuses the
        value ``unknown_schema``. Raises ``RegistryUnavailableError``.
        """
        if not value or value[:1] != _CONFLUENT_MAGIC or len(value) < CONFLUENT_HEADER_LEN:
            return
        schema_id = int.from_bytes(value[1:CONFLUENT_HEADER_LEN], "big")
        if self._codec.bound(schema_id):
            return
        schema = self._call(f"get schema {schema_id}", lambda c: _schema_or_none(c, schema_id))
        if schema is None:
            logger.warning("schema registry: schema id %d is not known", schema_id)
            return
        writer: Any = json.loads(schema.schema_str or "null")
        if (schema.schema_type or "AVRO") != "AVRO":
            writer = {"name": f"a {schema.schema_type} schema"}
        self._codec.bind_schema_id(schema_id, writer)

    def single_object(self, value: bytes | None) -> bytes | None:
        """``value`` in single-object form if it is Confluent-framed with a schema of ours."""
        if not value or value[:1] != _CONFLUENT_MAGIC or len(value) < CONFLUENT_HEADER_LEN:
            return value
        self.bind(value)
        header = self._codec.single_object_header(
            int.from_bytes(value[1:CONFLUENT_HEADER_LEN], "big")
        )
        return value if header is None else header + value[CONFLUENT_HEADER_LEN:]

    # --- the one place that calls the registry ---------------------------------------------

    def _call(self, what: str, call: Callable[[SchemaRegistryClient], T]) -> T:
        """``call(client)``, retried with backoff while the registry is unreachable."""
        deadline = time.monotonic() + _RETRY_S
        pause = _FIRST_PAUSE_S
        while True:
            try:
                return call(self.client)
            except SchemaRegistryError as exc:
                if exc.http_status_code < 500:
                    raise SchemaRefusedError(f"schema registry: {what}: {exc}") from exc
                problem = str(exc)
            except Exception as exc:  # the HTTP client's connection errors, timeouts, ...
                problem = f"{type(exc).__name__}: {exc}"
            if time.monotonic() >= deadline:
                raise RegistryUnavailableError(f"schema registry: {what}: {problem}")
            logger.warning("schema registry: %s: %s; retrying in %.1fs", what, problem, pause)
            time.sleep(pause)
            pause = min(pause * 2, _MAX_PAUSE_S)


def _schema_or_none(client: SchemaRegistryClient, schema_id: int) -> Schema | None:
    try:
        return client.get_schema(schema_id)
    except SchemaRegistryError as exc:
        if exc.error_code in _NOT_FOUND or exc.http_status_code == 404:
            return None
        raise
