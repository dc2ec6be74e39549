"""A processor under fuzzing, on either transport (a helper module: no tests here).

``fuzz_app(prefix)``: ``steps3`` (three pure steps), also started by a JSON trigger
on ``<prefix>user.orders`` with the input ``{"n": int(n)}``, and ``scalar`` (a step,
an await answered by the test, a step).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from processor.config.resume_secret import resume_keys
from processor.config.settings import Settings, schema_registry_config
from processor.engine.host import Host
from processor.facts.codec import codec, encode
from processor.facts.keyring import KeyRing
from processor.facts.models import BoundaryCompletion, BoundaryRequest, RunOutcome
from processor.facts.topics import TopicName
from processor.transport.base import Outbound, Producer, Reader, TopicSpec
from processor.transport.deployment import Deployment
from processor.transport.partitioner import partition_for
from processor.transport.schema_ids import SchemaIds
from processor.worker.pipeline import Application, Pipeline
from processor.worker.trigger import Trigger
from tests.apps.boundary_pipelines import scalar
from tests.apps.pipelines import FAST_RETRY, double, finish, parse
from tests.apps.support import TopicTail, wait_until
from tests.apps.trigger_pipelines import ORDERS, order_input

__all__ = ["Fuzzing", "fuzz_app", "fuzz_records", "fuzz_seed", "fuzzing"]


def fuzz_records() -> int:
    """Generated records per input topic: ``PROCESSOR_FUZZ_RECORDS`` (500 by default)."""
    return int(os.environ.get("PROCESSOR_FUZZ_RECORDS", "500"))


def fuzz_seed() -> int:
    """``PROCESSOR_FUZZ_SEED`` to replay a run; otherwise a new seed each run (printed)."""
    configured = os.environ.get("PROCESSOR_FUZZ_SEED")
    return int(configured) if configured else random.SystemRandom().randrange(2**32)


def fuzz_app(prefix: str) -> Application:
    steps3 = Pipeline("steps3", trigger=Trigger(prefix + ORDERS, order_input))
    for step in (parse, double, finish):
        steps3.step(timeout_s=5, retry=FAST_RETRY)(step)
    return Application([steps3, scalar])


@dataclass
class Fuzzing:
    """A started host, a producer and a reader of its log, and what the test answered."""

    deployment: Deployment
    host: Host
    producer: Producer
    reader: Reader
    keys: KeyRing
    prefix: str
    outcomes: dict[str, RunOutcome] = field(default_factory=dict)
    _outcome_tail: TopicTail | None = None

    def name(self, topic: TopicName) -> str:
        return self.deployment.topology.name(topic)

    @property
    def partitions(self) -> int:
        return self.deployment.topology.partitions

    def produce(
        self,
        topic: str,
        key: bytes,
        value: bytes | None,
        partition: int | None = None,
        headers: tuple[tuple[str, bytes], ...] = (),
    ) -> None:
        if partition is None:
            partition = partition_for(key, self.partitions)
        self.producer.produce(Outbound(topic, key, value, headers, partition))  # type: ignore[arg-type]

    def confluent_frame(self) -> Callable[[str, bytes], bytes] | None:
        """With a registry: (topic name in ``TopicName``, value) -> its Confluent framing."""
        settings = self.deployment.settings
        if settings.schema_registry_url is None:
            return None
        ids = SchemaIds(schema_registry_config(settings))
        return lambda topic, value: ids.confluent(self.name(TopicName(topic)), value)

    def refresh_outcomes(self) -> dict[str, RunOutcome]:
        if self._outcome_tail is None:
            self._outcome_tail = TopicTail(
                self.reader, self.name(TopicName.OUTCOMES), self.partitions
            )
        for record in self._outcome_tail.new():
            outcome = codec().decode_as(record.value, RunOutcome)
            self.outcomes[outcome.run_id] = outcome
        return self.outcomes

    def answer_awaits(self, run_ids: set[str], timeout_s: float = 60) -> list[tuple[str, bytes]]:
        """Complete the await of each run (reading its request); return the completions."""
        tail = TopicTail(self.reader, self.name(TopicName.REQUESTS), self.partitions)
        answered: dict[str, bytes] = {}

        def all_answered() -> bool:
            for record in tail.new():
                request = codec().decode_as(record.value, BoundaryRequest)
                if request.run_id in run_ids and request.run_id not in answered:
                    completion = BoundaryCompletion(
                        token=request.resume_token,
                        idempotency_key=f"fz-{request.interaction}",
                        outcome="success",
                        payload=b'{"answer":42}',
                        error=None,
                        content_type="application/json",
                    )
                    answered[request.run_id] = encode(completion)
                    topic = self.name(TopicName.COMPLETIONS)
                    self.produce(topic, request.run_id.encode(), answered[request.run_id])
            self.producer.flush()
            return answered.keys() == run_ids

        wait_until(all_answered, timeout_s, "the requests of the scalar runs")
        return list(answered.items())


def _settings(kind: str, data_dir: Path, extra: dict[str, Any]) -> tuple[Settings, object | None]:
    if kind == "embedded":
        return Settings(data_dir=data_dir, topic_prefix="fz.", **extra), None
    from tests.kafka.support import KafkaSpace
    from tests.kafka_broker import kafka_bootstrap, unavailable_reason

    bootstrap = kafka_bootstrap()
    if bootstrap is None:
        pytest.skip(unavailable_reason())
    space = KafkaSpace.new(bootstrap)
    if kind == "kafka+registry":  # every record of ours in the Confluent wire format
        from tests.schema_registry import schema_registry_url

        url = schema_registry_url()
        if url is None:
            pytest.skip("no schema registry")
        space = replace(space, schema_registry_url=url)
    return space.settings(data_dir).model_copy(update=extra), space


@contextmanager
def fuzzing(kind: str, data_dir: Path, *, workers: int = 2, **extra: Any) -> Iterator[Fuzzing]:
    """A host of ``fuzz_app`` on ``kind`` ("embedded", "kafka" or "kafka+registry"), its
    user topic made
    (``extra``: more settings)."""
    settings, space = _settings(kind, data_dir, extra)
    deployment = Deployment.from_settings(settings)
    prefix = settings.topic_prefix
    admin = deployment.transport.admin()
    try:
        user_topic = TopicSpec(prefix + ORDERS, deployment.topology.partitions)
        admin.create_topics([user_topic])
        wait_until(lambda: user_topic.name in admin.describe_topics(), 30, "the user topic")
    finally:
        admin.close()
    host = Host(deployment, fuzz_app(prefix), workers=workers)
    host.start()
    # The bytes as generated, never reframed (the registry transport frames ours).
    producer = getattr(deployment.transport, "inner", deployment.transport).producer()
    reader = deployment.transport.reader()
    try:
        keys = KeyRing(resume_keys(settings))
        yield Fuzzing(deployment, host, producer, reader, keys, prefix)
    finally:
        host.stop()
        producer.close()
        reader.close()
        if space is not None:
            space.delete_topics()  # type: ignore[attr-defined]
