"""Topics as code: declarations name real schemas; drift and co-partitioning checks."""

from __future__ import annotations

import pytest

from processor.errors import ConfigurationError
from processor.facts.models import FACT_TYPES, MESSAGE_TYPES
from processor.facts.topics import RUN_ADDRESSED_INPUTS, TopicName
from processor.transport.base import TopicSpec
from processor.transport.topology import Topology, load_declarations


def test_every_topic_is_declared_with_known_value_schemas() -> None:
    declarations = load_declarations()
    assert {d.name for d in declarations} == set(TopicName)
    known = {m.__name__ for m in (*FACT_TYPES, *MESSAGE_TYPES)}
    for declaration in declarations:
        assert set(declaration.values) <= known, declaration.name


def test_the_journal_declares_every_fact_and_is_kept_forever() -> None:
    facts = next(d for d in load_declarations() if d.name is TopicName.FACTS)
    assert set(facts.values) == {f.__name__ for f in FACT_TYPES} | {"FactBatch"}
    assert facts.config["retention.ms"] == "-1"
    assert facts.config["cleanup.policy"] == "delete"


def test_run_addressed_inputs_are_co_partitioned_with_the_journal() -> None:
    co = {d.name for d in load_declarations() if d.co_partitioned}
    assert {*RUN_ADDRESSED_INPUTS, TopicName.FACTS} <= co


def test_drift_reports_missing_topics_partition_counts_and_configs() -> None:
    topology = Topology(prefix="x.", partitions=4)
    existing = {s.name: s for s in topology.specs()}
    assert topology.drift(existing) == []
    facts = topology.name(TopicName.FACTS)
    existing[facts] = TopicSpec(facts, 2, {"retention.ms": "1000"})
    del existing[topology.name(TopicName.DLQ)]
    problems = {(d.topic, d.problem.split(",")[0].split("=")[0]) for d in topology.drift(existing)}
    assert (topology.name(TopicName.DLQ), "missing") in problems
    assert (facts, "2 partitions") in problems
    assert (facts, "retention.ms") in problems


def test_the_processor_refuses_co_partitioned_topics_with_different_counts() -> None:
    topology = Topology(partitions=4)
    existing = {s.name: s for s in topology.specs()}
    assert topology.check_co_partitioning(existing) == 4
    commands = topology.name(TopicName.COMMANDS)
    existing[commands] = TopicSpec(commands, 3, {})
    with pytest.raises(ConfigurationError, match="one partition count"):
        topology.check_co_partitioning(existing)
