"""Triggers with ``decoder="avro"``: records a user wrote with confluent-kafka's
AvroSerializer start one run each; records that are not such Avro are refused
``trigger_decode_failed``; an unreachable registry refuses nothing.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from processor.config.settings import Settings
from processor.engine.host import Host
from processor.errors import RegistryUnavailableError
from processor.facts.codec import codec
from processor.facts.models import Rejected
from processor.facts.topics import TopicName
from processor.transport.avro_decoder import avro_decoder
from processor.transport.base import TopicSpec
from processor.worker.pipeline import Application, Pipeline
from processor.worker.trigger import DECODE_FAILED, TriggerRecord
from tests.apps.support import decode_records, read_topic, wait_until
from tests.kafka.support import KafkaSpace, read_outcomes

pytestmark = pytest.mark.kafka

RECORDS = 30
ORDER_SCHEMA = json.dumps(
    {
        "type": "record",
        "name": "Order",
        "namespace": "shop",
        "fields": [{"name": "order_id", "type": "string"}, {"name": "total", "type": "long"}],
    }
)


@pytest.fixture(autouse=True)
def _codec_mode() -> Iterator[None]:
    """A registry makes this process's codec read the Confluent framing; not for later tests."""
    before = codec().read_confluent
    yield
    codec().read_confluent = before


def avro_app(topic: str) -> Application:
    orders = Pipeline("avro_orders")

    @orders.trigger(topic, decoder="avro")
    def order_input(rec: TriggerRecord) -> dict[str, Any]:
        return {"order_id": rec.decoded["order_id"], "total": rec.decoded["total"]}

    @orders.step()
    def accept(order: dict[str, Any]) -> dict[str, Any]:
        return {"accepted": order["order_id"], "total": order["total"]}

    return Application([orders])


def _produce_orders(space: KafkaSpace, registry: str, topic: str) -> list[str]:
    """RECORDS orders, AvroSerializer-framed, random keys; then two records that are not."""
    client = SchemaRegistryClient({"url": registry})
    serializer = AvroSerializer(client, ORDER_SCHEMA)
    producer = Producer({"bootstrap.servers": space.bootstrap})
    ids = [f"order-{i}" for i in range(RECORDS)]
    context = SerializationContext(topic, MessageField.VALUE)
    try:
        for index, order_id in enumerate(ids):
            value = serializer({"order_id": order_id, "total": index}, context)
            producer.produce(topic, key=uuid.uuid4().hex, value=value)
    finally:
        client.close()
    producer.produce(topic, key=b"garbage", value=b"not avro at all")
    unknown_id = b"\x00" + random.randrange(2**30, 2**31).to_bytes(4, "big") + b"\x02x\x02"
    producer.produce(topic, key=b"unknown-id", value=unknown_id)
    assert producer.flush(30) == 0
    return ids


def test_avro_records_of_a_user_topic_start_one_run_each(
    space: KafkaSpace, schema_registry_url: str, tmp_path: Path
) -> None:
    registry_space = replace(space, schema_registry_url=schema_registry_url)
    deployment = registry_space.deployment(tmp_path / "data")
    topic = f"{space.prefix}shop.avro-orders"
    admin = deployment.transport.admin()
    try:
        admin.create_topics([TopicSpec(topic, 3)])
        wait_until(lambda: topic in admin.describe_topics(), 30, "the user topic")
    finally:
        admin.close()
    host = Host(deployment, avro_app(topic), workers=1)
    host.start()
    reader = deployment.transport.reader()
    topology = deployment.topology
    try:
        ids = _produce_orders(space, schema_registry_url, topic)
        outcomes = wait_until(
            lambda: (found := read_outcomes(reader, topology)) and len(found) >= RECORDS and found,
            90,
            f"{RECORDS} runs to finish",
        )

        def refused() -> list[Rejected]:
            records = read_topic(reader, topology.name(TopicName.REJECTED), topology.partitions)
            return decode_records(records, Rejected)

        rejected = wait_until(lambda: len(found := refused()) >= 2 and found, 60, "2 refusals")
    finally:
        reader.close()
        host.stop()
    assert not host.errors, host.errors
    assert len(outcomes) == RECORDS
    assert all(o.status == "succeeded" for o in outcomes)
    accepted = sorted(json.loads(o.result or b"")["accepted"] for o in outcomes)
    assert accepted == sorted(ids)  # one run per record, none twice
    assert sorted(r.reason for r in rejected) == [DECODE_FAILED, DECODE_FAILED]
    by_key = {r.original_key: r for r in rejected}
    assert by_key[b"garbage"].original_value == b"not avro at all"
    assert "not in the registry" in by_key[b"unknown-id"].detail


def test_an_unreachable_registry_is_a_transport_error_not_a_refusal(tmp_path: Path) -> None:
    decoder = avro_decoder(
        Settings(data_dir=tmp_path, schema_registry_url="http://127.0.0.1:9/apis/ccompat/v7")
    )
    with pytest.raises(RegistryUnavailableError):
        decoder(b"\x00\x00\x00\x00\x01\x02x\x02")
    with pytest.raises(ValueError, match="not Confluent-framed"):
        decoder(b"{}")
    del decoder  # closes its registry client
