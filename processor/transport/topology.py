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

__all__ = ["TOPICS_FILE", "Drift", "TopicDeclaration", "Topology", "load_declarations"]

TOPICS_FILE = Path(__file__).resolve().parent.parent / "topics" / "topics.toml"


@dataclass(frozen=True, slots=True)
class TopicDeclaration:
    name: TopicName
    key: str
    values: tuple[str, ...]
    co_partitioned: bool
    config: Mapping[str, str] = field(default_factory=dict)


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


@dataclass(frozen=True, slots=True)
class Topology:
    """Physical topic names (an optional prefix) and the partition count of a deployment."""

    prefix: str = ""
    partitions: int = default_of("partitions")
    declarations: tuple[TopicDeclaration, ...] = field(default_factory=load_declarations)

    def name(self, topic: TopicName) -> str:
        return f"{self.prefix}{topic.value}"

    def specs(self) -> list[TopicSpec]:
        return [
            TopicSpec(self.name(d.name), self.partitions, dict(d.config)) for d in self.declarations
        ]

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
