"""The settings, log and topics that one command works against."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from processor.config.settings import Settings
from processor.errors import ConfigurationError
from processor.facts.topics import TopicName
from processor.transport.base import Transport
from processor.transport.durability import Durability, embedded_durability, kafka_durability
from processor.transport.factory import open_transport
from processor.transport.topology import Replication, Topology, load_replication

__all__ = ["Deployment", "ensure_topics", "journal_durability"]


@dataclass(frozen=True, slots=True)
class Deployment:
    """The settings, log and topics that one command works against."""

    settings: Settings
    transport: Transport
    topology: Topology

    @staticmethod
    def from_settings(settings: Settings) -> Deployment:
        """The deployment ``settings`` name; an existing journal's partition count wins.

        Every client must place run ids on the partitions the topics really have,
        so once runs.facts exists its partition count overrides the setting (which
        only sizes topics that are still to be created).
        """
        transport = open_transport(settings)
        topology = Topology(
            prefix=settings.topic_prefix,
            partitions=settings.partitions,
            replication=_replication(settings),
        )
        admin = transport.admin()
        try:
            journal = admin.describe_topics().get(topology.name(TopicName.FACTS))
        finally:
            admin.close()
        if journal is not None and journal.partitions != topology.partitions:
            topology = replace(topology, partitions=journal.partitions)
        return Deployment(settings, transport, topology)


def journal_durability(deployment: Deployment) -> Durability:
    """The durability mode the deployment's journal (runs.facts) gives its commits."""
    settings = deployment.settings
    if settings.broker is None:
        return embedded_durability(settings.durable_fsync)
    admin = deployment.transport.admin()
    try:
        journal = admin.describe_topics().get(deployment.topology.name(TopicName.FACTS))
    finally:
        admin.close()
    if journal is None:
        raise ConfigurationError("runs.facts does not exist: run `processor topics apply`")
    return kafka_durability(journal.replication, journal.min_insync_replicas)


def _replication(settings: Settings) -> Replication:
    """``topics.toml``'s replication, with what the settings override."""
    declared = load_replication()
    return Replication(
        settings.topic_replication or declared.factor,
        settings.topic_min_insync_replicas or declared.min_insync_replicas,
    )


def ensure_topics(deployment: Deployment, output_topics: Iterable[str] = ()) -> list[str]:
    """Create the declared topics (and a pipeline's output topics) that are missing."""
    specs = deployment.topology.specs() + [deployment.topology.spec(name) for name in output_topics]
    admin = deployment.transport.admin()
    try:
        return admin.create_topics(specs)
    finally:
        admin.close()
