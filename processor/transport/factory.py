"""Choose the transport from the settings: Kafka when a broker URL is given.

With a schema registry too, the Kafka transport is wrapped in ``RegistryTransport``
(Confluent wire format).
"""

from __future__ import annotations

from processor.config.settings import Settings, schema_registry_config
from processor.errors import ConfigurationError
from processor.transport.base import Transport

__all__ = ["open_transport"]


def open_transport(settings: Settings) -> Transport:
    """The transport ``settings`` name."""
    if settings.broker is None:
        if settings.schema_registry_url is not None:
            raise ConfigurationError("the schema registry needs a Kafka broker (PROCESSOR_BROKER)")
        from processor.transport.embedded import EmbeddedTransport

        return EmbeddedTransport(
            settings.log_dir, durable=settings.durable_fsync, default_partitions=settings.partitions
        )
    from processor.transport.kafka import KafkaTransport

    if settings.schema_registry_url is None:
        return KafkaTransport(settings)
    from processor.transport.registry import RegistryTransport
    from processor.transport.schema_ids import SchemaIds

    return RegistryTransport(KafkaTransport(settings), SchemaIds(schema_registry_config(settings)))
