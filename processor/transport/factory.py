"""Choose the transport from the settings: Kafka when a broker URL is given."""

from __future__ import annotations

from processor.config.settings import Settings
from processor.transport.base import Transport

__all__ = ["open_transport"]


def open_transport(settings: Settings) -> Transport:
    if settings.broker is None:
        from processor.transport.embedded import EmbeddedTransport

        return EmbeddedTransport(
            settings.log_dir, durable=settings.durable_fsync, default_partitions=settings.partitions
        )
    from processor.transport.kafka import KafkaTransport

    return KafkaTransport(settings)
