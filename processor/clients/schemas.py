"""``processor schemas apply``: every topic's record schemas in the Schema Registry.

For each declared topic (topics/topics.toml) and each record type it carries,
the subject ``<physical topic>-<record full name>`` gets BACKWARD compatibility
and the current schema. The registry checks the change: an incompatible one is
refused with the registry's own answer (``SchemaRefusedError``) and nothing
after it is registered.
"""

from __future__ import annotations

from dataclasses import dataclass

from processor.config.settings import Settings, schema_registry_config
from processor.facts.models import FACT_TYPES, MESSAGE_TYPES, AvroModel
from processor.transport.schema_ids import SchemaIds, subject_name
from processor.transport.topology import Topology, load_declarations

__all__ = ["COMPATIBILITY", "AppliedSubject", "apply_schemas", "declared_subjects"]

#: Consumers upgraded first can read what older producers wrote (Confluent's default).
COMPATIBILITY = "BACKWARD"

_MODELS: dict[str, type[AvroModel]] = {m.__name__: m for m in (*FACT_TYPES, *MESSAGE_TYPES)}


@dataclass(frozen=True, slots=True)
class AppliedSubject:
    subject: str
    schema_id: int
    compatibility: str


def declared_subjects(topology: Topology) -> list[tuple[str, type[AvroModel]]]:
    """(physical topic, record type) of every record type each declared topic carries."""
    return [
        (topology.name(declaration.name), _MODELS[value])
        for declaration in load_declarations()
        for value in declaration.values
    ]


def apply_schemas(settings: Settings) -> list[AppliedSubject]:
    """Set BACKWARD compatibility and register the current schema of every subject.

    Raises ``SchemaRefusedError`` (with the registry's answer) on an incompatible
    change and ``RegistryUnavailableError`` when the registry does not answer.
    """
    ids = SchemaIds(schema_registry_config(settings))
    topology = Topology(prefix=settings.topic_prefix, partitions=settings.partitions)
    applied = []
    try:
        for topic, model in declared_subjects(topology):
            subject = subject_name(topic, model)
            ids.set_compatibility(subject, COMPATIBILITY)
            applied.append(AppliedSubject(subject, ids.register(topic, model), COMPATIBILITY))
    finally:
        ids.close()
    return applied
