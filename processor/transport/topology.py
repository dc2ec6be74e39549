"""Topics as code: the declarations in ``topics/topics.toml`` and their physical names."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from processor.config.settings import default_of
from processor.errors import ConfigurationError
from processor.facts.topics import TopicName
from processor.transport.base import TopicSpec

__all__ = [
    "TOPICS_FILE",
    "Drift",
    "Replication",
    "TopicDeclaration",
    "Topology",
    "load_declarations",
    "load_replication",
]

TOPICS_FILE = Path(__file__).resolve().parent.parent / "topics" / "topics.toml"


@dataclass(frozen=True, slots=True)
class TopicDeclaration:
    name: TopicName
    key: str
    values: tuple[str, ...]
    co_partitioned: bool
    config: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Replication:
    """Replicas of each topic created on Kafka, and how many must hold a record before
    it is acknowledged (``min.insync.replicas``)."""

    factor: int
    min_insync_replicas: int

    def __post_init__(self) -> None:
        if self.factor < 1 or self.min_insync_replicas < 1:
            raise ConfigurationError("topic replication and min.insync.replicas must be >= 1")
        if self.min_insync_replicas > self.factor:
            raise ConfigurationError(
                f"min.insync.replicas {self.min_insync_replicas} is more than the "
                f"replication factor {self.factor}: no write could ever be acknowledged"
            )


@dataclass(frozen=True, slots=True)
class Drift:
    topic: str
    problem: str


def load_declarations(path: Path = TOPICS_FILE) -> tuple[TopicDeclaration, ...]:
    raw = tomllib.loads(path.read_text())
    return tuple(
        TopicDeclaration(
            name=TopicName(item["name"]),
            key=item["key"],
            values=tuple(item["values"]),
            co_partitioned=bool(item["co_partitioned"]),
            config={k: str(v) for k, v in item.get("config", {}).items()},
        )
        for item in raw["topic"]
    )


def load_replication(path: Path = TOPICS_FILE) -> Replication:
    """The replication defaults declared in ``topics.toml`` (``[replication]``)."""
    raw = tomllib.loads(path.read_text()).get("replication", {})
    return Replication(int(raw.get("factor", 1)), int(raw.get("min_insync_replicas", 1)))


@dataclass(frozen=True, slots=True)
class Topology:
    """Physical topic names (an optional prefix), the partition count and the replication
    of a deployment."""

    prefix: str = ""
    partitions: int = default_of("partitions")
    declarations: tuple[TopicDeclaration, ...] = field(default_factory=load_declarations)
    replication: Replication = field(default_factory=load_replication)

    def name(self, topic: TopicName) -> str:
        return f"{self.prefix}{topic.value}"

    def specs(self) -> list[TopicSpec]:
        return [self.spec(self.name(d.name), dict(d.config)) for d in self.declarations]

    def spec(self, name: str, config: Mapping[str, str] | None = None) -> TopicSpec:
        """A topic of this deployment: its partitions and replication."""
        return TopicSpec(
            name,
            self.partitions,
            dict(config or {}),
            self.replication.factor,
            self.replication.min_insync_replicas,
        )

    def drift(self, existing: Mapping[str, TopicSpec]) -> list[Drift]:
        """Differences between the declarations and the topics that exist."""
        found = []
        for wanted in self.specs():
            have = existing.get(wanted.name)
            if have is None:
                found.append(Drift(wanted.name, "missing"))
                continue
            if have.partitions != wanted.partitions:
                found.append(
                    Drift(
                        wanted.name, f"{have.partitions} partitions, declared {wanted.partitions}"
                    )
                )
            for key, value in wanted.config.items():
                if key in have.config and have.config[key] != value:
                    found.append(Drift(wanted.name, f"{key}={have.config[key]}, declared {value}"))
        return found

    def check_co_partitioning(self, existing: Mapping[str, TopicSpec]) -> int:
        """The shared partition count of the co-partitioned topics; refuse to start otherwise."""
        counts = {}
        for d in self.declarations:
            if not d.co_partitioned:
                continue
            spec = existing.get(self.name(d.name))
            if spec is None:
                raise ConfigurationError(
                    f"topic {self.name(d.name)} does not exist: run `processor topics apply`"
                )
            counts[spec.name] = spec.partitions
        if len(set(counts.values())) != 1:
            raise ConfigurationError(
                "co-partitioned topics must have one partition count, found "
                + ", ".join(f"{name}={n}" for name, n in sorted(counts.items()))
            )
        return next(iter(counts.values()))
