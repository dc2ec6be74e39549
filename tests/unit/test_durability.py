"""Durability modes: named from how the log is set up, and said at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from processor.config.settings import Settings
from processor.errors import ConfigurationError
from processor.transport.deployment import Deployment, journal_durability
from processor.transport.durability import embedded_durability, kafka_durability
from processor.transport.topology import Replication, load_replication


def test_the_embedded_log_survives_a_power_loss_only_with_fsync() -> None:
    assert embedded_durability(False).mode == "embedded"
    assert "not a power loss" in embedded_durability(False).survives
    assert embedded_durability(True).mode == "embedded-fsync"
    assert "power loss" in embedded_durability(True).survives


@pytest.mark.parametrize(
    ("replication", "min_insync", "mode", "lost"),
    [
        (1, 1, "kafka-single-copy", None),
        (3, 1, "kafka-single-copy", None),  # acks=all may be the leader alone
        (1, 2, "kafka-single-copy", None),  # one copy whatever min.insync.replicas says
        (3, 2, "kafka-replicated", "1 broker"),
        (5, 3, "kafka-replicated", "2 brokers"),
    ],
)
def test_kafka_modes_follow_the_copies_an_acknowledgement_needs(
    replication: int, min_insync: int, mode: str, lost: str | None
) -> None:
    found = kafka_durability(replication, min_insync)
    assert found.mode == mode
    if lost is not None:
        assert f"the loss of {lost}" in found.survives
    line = found.describe()
    assert line.startswith(f"durability {mode} (replication {replication}, ")
    assert f"min.insync.replicas {min_insync}" in line


def test_topics_toml_declares_production_replication() -> None:
    assert load_replication() == Replication(3, 2)


def test_a_replication_that_could_never_acknowledge_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"min\.insync\.replicas 3 is more than"):
        Replication(2, 3)
    with pytest.raises(ConfigurationError, match=">= 1"):
        Replication(0, 1)


def test_settings_override_the_declared_replication(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, topic_replication=5, topic_min_insync_replicas=3)
    topology = Deployment.from_settings(settings).topology
    assert topology.replication == Replication(5, 3)
    specs = {spec.name: spec for spec in topology.specs()}
    assert specs["runs.facts"].replication == 5
    assert specs["runs.facts"].min_insync_replicas == 3
    assert Deployment.from_settings(Settings(data_dir=tmp_path)).topology.replication == (
        Replication(3, 2)
    )


@pytest.mark.parametrize(("fsync", "mode"), [(False, "embedded"), (True, "embedded-fsync")])
def test_an_embedded_deployment_names_its_mode(tmp_path: Path, fsync: bool, mode: str) -> None:
    deployment = Deployment.from_settings(Settings(data_dir=tmp_path, durable_fsync=fsync))
    assert journal_durability(deployment).mode == mode
