"""Creating and describing Kafka topics; the offsets a group committed."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource, ConfigSource  # not re-exported
from confluent_kafka.cimpl import NewTopic  # not re-exported

from processor.errors import TransportError
from processor.transport.base import Closeable, TopicPartition, TopicSpec
from processor.transport.kafka_common import ErrorReporter, kafka_error, translate

__all__ = ["KafkaAdmin"]

logger = logging.getLogger(__name__)

_REQUEST_TIMEOUT_S = 60.0
_OPERATION_TIMEOUT_S = 30.0
_METADATA_TIMEOUT_S = 10.0
_MAX_REPLICATION = 3
_MIN_INSYNC = "min.insync.replicas"


class KafkaAdmin(Closeable):
    """Creates and describes topics, reads groups' committed offsets (an ``AdminClient``).

    A topic is created with its spec's replication and ``min.insync.replicas``, each
    capped by the brokers in the cluster (a spec without them: ``min(3, brokers)``
    replicas and the broker's default); a spec with fewer than one partition gets the
    transport's default count. ``describe_topics`` reports each topic's own
    configuration overrides (what was set at creation or altered since), not the
    broker defaults it inherits, and its replication and effective
    ``min.insync.replicas``.
    """

    def __init__(self, config: dict[str, Any], default_partitions: int) -> None:
        self._reporter = ErrorReporter("admin")
        try:
            self._admin = AdminClient(config | self._reporter.config())
        except KafkaException as exc:
            raise translate("create admin client", exc) from exc
        self._default_partitions = default_partitions

    def create_topics(self, specs: Sequence[TopicSpec]) -> list[str]:
        """Create the missing topics and wait until they are usable; return the names created."""
        if any(not spec.name for spec in specs):
            raise ValueError("a topic needs a name")
        metadata = self._metadata()
        brokers = len(metadata.brokers)
        wanted = {spec.name: spec for spec in specs if spec.name not in metadata.topics}
        if not wanted:
            return []
        new_topics = [self._new_topic(spec, brokers) for spec in wanted.values()]
        try:
            futures = self._admin.create_topics(
                new_topics,
                operation_timeout=_OPERATION_TIMEOUT_S,
                request_timeout=_REQUEST_TIMEOUT_S,
            )
        except KafkaException as exc:
            raise translate("create topics", exc) from exc
        created = [name for name, future in futures.items() if _created(name, future)]
        self._await_visible(created)
        replication = {topic.topic: topic.replication_factor for topic in new_topics}
        for name in created:
            logger.info("created topic %s (replication %d)", name, replication[name])
        return created

    def describe_topics(self) -> dict[str, TopicSpec]:
        """Every non-internal topic: name -> TopicSpec(name, partitions, config overrides)."""
        listed = {
            name: topic
            for name, topic in self._metadata().topics.items()
            if not name.startswith("__")
        }
        configs = self._configs(sorted(listed))
        return {  # a topic deleted since the listing has no configs: it is left out
            name: TopicSpec(
                name,
                len(topic.partitions),
                configs[name][0],
                _replicas(topic),
                configs[name][1],
            )
            for name, topic in sorted(listed.items())
            if name in configs
        }

    def committed_offsets(
        self, group: str, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, int]:
        """The offsets ``group`` committed (OffsetFetch: a transaction's once it committed)."""
        wanted = [KafkaTopicPartition(tp.topic, tp.partition) for tp in partitions]
        try:
            futures = self._admin.list_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group, wanted)], request_timeout=_REQUEST_TIMEOUT_S
            )
            listed = futures[group].result()
        except KafkaException as exc:
            raise translate(f"read the offsets of group {group}", exc) from exc
        return {
            TopicPartition(p.topic, p.partition): p.offset
            for p in listed.topic_partitions
            if p.error is None and p.offset >= 0
        }

    def close(self) -> None:
        """Release the client (the admin client has no connection state to flush)."""

    def _new_topic(self, spec: TopicSpec, brokers: int) -> NewTopic:
        partitions = spec.partitions if spec.partitions >= 1 else self._default_partitions
        wanted = spec.replication or _MAX_REPLICATION
        replication = max(1, min(wanted, brokers))
        config = {key: str(value) for key, value in spec.config.items()}
        if spec.min_insync_replicas:
            config.setdefault(_MIN_INSYNC, str(max(1, min(spec.min_insync_replicas, replication))))
        if replication < wanted:
            logger.warning(
                "topic %s: %d replicas wanted, %d broker(s) in the cluster: created with %d",
                spec.name,
                wanted,
                brokers,
                replication,
            )
        return NewTopic(
            spec.name,
            num_partitions=partitions,
            replication_factor=replication,
            config=config,
        )

    def _metadata(self) -> Any:
        try:
            return self._admin.list_topics(timeout=_METADATA_TIMEOUT_S)
        except KafkaException as exc:
            raise translate("list topics", exc) from exc

    def _configs(self, names: list[str]) -> dict[str, tuple[dict[str, str], int]]:
        """Each topic's own config overrides (source DYNAMIC_TOPIC_CONFIG), and its
        effective ``min.insync.replicas`` (from whichever source sets it)."""
        if not names:
            return {}
        resources = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in names]
        try:
            futures = self._admin.describe_configs(resources, request_timeout=_REQUEST_TIMEOUT_S)
        except KafkaException as exc:
            raise translate("describe topic configs", exc) from exc
        configs: dict[str, tuple[dict[str, str], int]] = {}
        for resource, future in futures.items():
            entries = _topic_configs(future)
            if entries is not None:
                overrides = {
                    key: entry.value
                    for key, entry in entries.items()
                    if entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
                    and entry.value is not None
                }
                min_insync = entries.get(_MIN_INSYNC)
                value = min_insync.value if min_insync is not None else None
                configs[resource.name] = (overrides, int(value) if value else 1)
        return configs

    def _await_visible(self, names: list[str]) -> None:
        """Wait until every partition of the created topics has a leader in the metadata."""
        deadline = time.monotonic() + _OPERATION_TIMEOUT_S
        pending = set(names)
        while pending:
            topics = self._metadata().topics
            pending = {name for name in pending if not _ready(topics.get(name))}
            if not pending:
                return
            if time.monotonic() >= deadline:
                missing = ", ".join(sorted(pending))
                raise TransportError(f"created topics not visible yet: {missing}")
            time.sleep(0.05)  # waiting for metadata propagation; no event to wait on


def _created(name: str, future: Future[None]) -> bool:
    """True when ``future`` created topic ``name``; False when it existed already."""
    try:
        future.result()
    except KafkaException as exc:
        err = kafka_error(exc)
        if err is not None and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
            logger.debug("topic %s exists; left unchanged", name)
            return False
        raise translate(f"create topic {name}", exc) from exc
    return True


def _replicas(topic: Any) -> int:
    """A described topic's replication factor: its first partition's replica count."""
    partitions = list(topic.partitions.values())
    return len(partitions[0].replicas) if partitions else 0


def _ready(topic: Any) -> bool:
    if topic is None or topic.error is not None or not topic.partitions:
        return False
    return all(p.leader >= 0 and p.error is None for p in topic.partitions.values())


def _topic_configs(future: Future[Any]) -> dict[str, Any] | None:
    """A described topic's config entries; None for a topic deleted since it was listed
    (another client's), which is no error."""
    try:
        result: dict[str, Any] = future.result()
    except KafkaException as exc:
        error = kafka_error(exc)
        if error is not None and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return None
        raise translate("describe topic configs", exc) from exc
    return result
