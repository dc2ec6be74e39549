"""A Kafka client that knows nothing of this package: confluent-kafka and the registry only.

Run as a script by the registry tests, so that nothing from ``processor`` can be
imported behind its back (it checks ``sys.modules`` before it prints)::

    python tests/kafka/interop_client.py read BOOTSTRAP REGISTRY TOPIC
    python tests/kafka/interop_client.py answer BOOTSTRAP REGISTRY REQUESTS COMPLETIONS

``read`` prints every record of TOPIC (all partitions, to the end) as JSON lines
``{"schema_id", "record_name", "value"}``, each fact of a ``FactBatch`` record as a
line of its own (with ``"batched": true``); ``answer`` reads the first request on
REQUESTS and answers it on COMPLETIONS with the schema the registry holds for
``<COMPLETIONS>-processor.messages.BoundaryCompletion`` (AvroSerializer,
TopicRecordNameStrategy), echoing the request payload under ``"echo"``.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient, topic_record_subject_name_strategy
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

_DEADLINE_S = 60.0
FACT_BATCH = "processor.messages.FactBatch"


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def read(bootstrap: str, registry: str, topic: str) -> list[dict[str, Any]]:
    """Every record of ``topic``, deserialized with the writer schema from the registry."""
    client = SchemaRegistryClient({"url": registry})
    deserializer = AvroDeserializer(client)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"interop-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        remaining, out = set(partitions), []
        deadline = time.monotonic() + _DEADLINE_S
        while remaining and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            if message.error():
                remaining.discard(message.partition())  # partition EOF
                continue
            entry = _decoded(client, deserializer, topic, message.value())
            if entry["record_name"] != FACT_BATCH:
                out.append(entry)
                continue
            # Facts committed together: each one framed and registered on its own.
            for fact in entry["raw_facts"]:
                out.append({**_decoded(client, deserializer, topic, fact), "batched": True})
        return out
    finally:
        consumer.close()


def _decoded(
    client: SchemaRegistryClient, deserializer: AvroDeserializer, topic: str, raw: bytes
) -> dict[str, Any]:
    schema_id = int.from_bytes(raw[1:5], "big") if raw[:1] == b"\x00" else None
    value = deserializer(raw, SerializationContext(topic, MessageField.VALUE))
    name = client.get_schema(schema_id).schema_str if schema_id is not None else None
    record_name = json.loads(name)["namespace"] + "." + json.loads(name)["name"]
    if record_name == FACT_BATCH:
        return {"schema_id": schema_id, "record_name": record_name, "raw_facts": value["facts"]}
    return {"schema_id": schema_id, "record_name": record_name, "value": _plain(value)}


def answer(bootstrap: str, registry: str, requests: str, completions: str) -> dict[str, Any]:
    """Answer the first request on ``requests``; return what was sent."""
    request = next(iter(read(bootstrap, registry, requests)))["value"]
    client = SchemaRegistryClient({"url": registry})
    subject = f"{completions}-processor.messages.BoundaryCompletion"
    schema = client.get_latest_version(subject).schema
    serializer = AvroSerializer(
        client,
        schema,
        conf={
            "auto.register.schemas": False,
            "subject.name.strategy": topic_record_subject_name_strategy,
        },
    )
    completion = {
        "token": request["resume_token"],
        "idempotency_key": f"interop-{request['interaction']}",
        "outcome": "success",
        "payload": json.dumps({"echo": json.loads(request["request"])}).encode(),
        "error": None,
        "content_type": "application/json",
    }
    value = serializer(completion, SerializationContext(completions, MessageField.VALUE))
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    producer.produce(completions, value, request["run_id"].encode())
    if producer.flush(30):
        raise SystemExit("the completion was not delivered")
    return {"run_id": request["run_id"], "schema_id": int.from_bytes(value[1:5], "big")}


def main(argv: list[str]) -> None:
    command, *args = argv
    result: Any = read(*args) if command == "read" else answer(*args)
    leaked = sorted(name for name in sys.modules if name.split(".")[0] == "processor")
    if leaked:
        raise SystemExit(f"imported from processor: {leaked}")
    for line in result if command == "read" else [result]:
        print(json.dumps(line))


if __name__ == "__main__":
    main(sys.argv[1:])
