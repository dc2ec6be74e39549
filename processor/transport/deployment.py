"""The settings, log and topics that one command works against."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from processor.config.settings import Settings
from processor.facts.topics import TopicName
from processor.transport.base import TopicSpec, Transport
from processor.transport.factory import open_transport
from processor.transport.topology import Topology

__all__ = ["Deployment", "ensure_topics"]


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
        topology = Topology(prefix=settings.topic_prefix, partitions=settings.partitions)
        admin = transport.admin()
        try:
            journal = admin.describe_topics().get(topology.name(TopicName.FACTS))
        finally:
            admin.close()
        if journal is not None and journal.partitions != topology.partitions:
            topology = replace(topology, partitions=journal.partitions)
        return Deployment(settings, transport, topology)


def ensure_topics(deployment: Deployment, output_topics: Iterable[str] = ()) -> list[str]:
    """Create the declared topics (and a pipeline's output topics) that are missing."""
    partitions = deployment.topology.partitions
    specs = deployment.topology.specs() + [
        TopicSpec(name, partitions, {}) for name in output_topics
    ]
    admin = deployment.transport.admin()
    try:
        return admin.create_topics(specs)
    finally:
        admin.close()
