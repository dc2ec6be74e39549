"""Settings are the one source of every default; the layers below take theirs from it."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from pydantic import ValidationError

from processor.config.settings import Settings, default_of
from processor.engine.loop import LoopConfig
from processor.facts.keyring import KeyRing
from processor.restore.assignment import RestoreConfig
from processor.transport.deployment import Deployment
from processor.transport.embedded import EmbeddedTransport
from processor.transport.kafka import KafkaTransport
from processor.transport.topology import Topology
from processor.worker.pipeline import Application, Pipeline
from processor.worker.service import Worker


def test_the_loop_configuration_comes_from_the_settings(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path,
        group="g",
        max_batch=7,
        poll_timeout_ms=20,
        timer_interval_ms=3,
        timer_batch=11,
        keep_runs=17,
        stable_wait_ms=1500,
        parallel_restore_min_facts=13,
        native_fold=False,
        max_payload_bytes=2048,
        max_infrastructure_losses=5,
        worker_announce_interval_ms=700,
    )
    config = LoopConfig.from_settings(settings, instance_id="i-1", resume_keys=KeyRing.single(b"s"))
    assert config == LoopConfig(
        state_dir=tmp_path / "state" / "g",
        group="g",
        instance_id="i-1",
        max_batch=7,
        poll_timeout_s=0.02,
        timer_interval_ms=3,
        timer_batch=11,
        keep_runs=17,
        resume_keys=KeyRing.single(b"s"),
        stable_wait_s=1.5,
        parallel_restore_min_facts=13,
        native_fold=False,
        max_payload_bytes=2048,
        max_infrastructure_losses=5,
        announce_interval_ms=700,
    )


def test_a_restore_takes_its_configuration_from_the_loops(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path,
        keep_runs=17,
        stable_wait_ms=1500,
        parallel_restore_min_facts=13,
        native_fold=False,
    )
    config = LoopConfig.from_settings(settings, instance_id="i-1", resume_keys=KeyRing.single(b""))
    assert config.restore == RestoreConfig(
        state_dir=settings.state_dir,
        stable_wait_s=1.5,
        parallel_min_facts=13,
        native_fold=False,
        keep_runs=17,
    )


def test_a_worker_takes_its_configuration_from_the_settings(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path,
        worker_group="wg",
        worker_concurrency=3,
        max_payload_bytes=2048,
        start_report_after_ms=40,
        worker_announce_interval_ms=700,
    )
    deployment = Deployment(settings, EmbeddedTransport(tmp_path / "log"), Topology())
    pipeline = Pipeline("p")

    @pipeline.step()
    def only(value: int) -> int:
        return value

    app = Application([pipeline])
    worker = Worker.from_settings(deployment, app)
    announced = worker.announcer.announcement()
    assert (announced.group, announced.concurrency, worker.concurrency) == ("wg", 3, 3)
    assert worker.worker_id.startswith("worker-")
    assert (worker._max_payload_bytes, worker._start_report_after_ms) == (2048, 40)
    assert worker.announcer._interval_ms == 700

    static = Worker.from_settings(
        deployment, app, concurrency=5, worker_id="i-1-w0", static_member=True, clock=lambda: 9
    )
    announced = static.announcer.announcement()
    assert (static.worker_id, static.concurrency, announced.at_ms) == ("i-1-w0", 5, 9)
    assert static._instance_id == "i-1-w0"


def test_defaults_below_the_settings_are_the_settings_defaults() -> None:
    assert default_of("partitions") == Settings.model_fields["partitions"].default == 4
    assert Topology().partitions == default_of("partitions")


def test_the_kafka_transport_takes_its_timeouts_from_the_settings() -> None:
    settings = Settings(
        broker="kafka://127.0.0.1:1",
        kafka_session_timeout_ms=7_000,
        kafka_max_poll_interval_ms=8_000,
        kafka_transaction_timeout_ms=9_000,
    )
    transport = KafkaTransport(settings)
    assert transport._membership == {
        "session.timeout.ms": 7_000,
        "heartbeat.interval.ms": 2_333,
        "max.poll.interval.ms": 8_000,
    }
    assert transport._transaction_timeout_ms == 9_000
    overridden = KafkaTransport(settings, transaction_timeout_ms=2_000)
    assert overridden._transaction_timeout_ms == 2_000


#: Values people leave in place of a secret: compose's old defaults, the README's old
#: example, and their spellings.
PLACEHOLDERS = [
    "change-me",
    "change-me-not-a-real-secret",
    "change-me-not-a-real-token",
    "CHANGEME-0123456789abcdef",
    "Change_Me_Please_0123456789",
    "replace-me-with-a-long-random-value",
    "<placeholder-0123456789abcdef>",
    "not-a-real-secret-0123456789",
]


@pytest.mark.parametrize("value", PLACEHOLDERS)
@pytest.mark.parametrize("variable", ["PROCESSOR_RESUME_SECRET", "PROCESSOR_HTTP_TOKEN"])
def test_a_placeholder_secret_is_refused_naming_its_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError) as refused:
        Settings()
    (error,) = refused.value.errors()
    assert error["msg"].startswith(f"{variable} is a placeholder, not a secret")
    assert value not in error["msg"]  # a secret is never echoed, even a would-be one


def test_a_placeholder_in_the_key_list_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROCESSOR_RESUME_SECRETS", "k2:change-me-not-a-real-secret,k1:" + "a" * 32)
    with pytest.raises(ValidationError) as refused:
        Settings()
    assert refused.value.errors()[0]["msg"].startswith("PROCESSOR_RESUME_SECRETS is a placeholder")


def test_random_secrets_are_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    token, secret = secrets.token_hex(32), secrets.token_urlsafe(32)
    monkeypatch.setenv("PROCESSOR_HTTP_TOKEN", token)
    monkeypatch.setenv("PROCESSOR_RESUME_SECRET", secret)
    settings = Settings()
    assert settings.http_token is not None and settings.resume_secret is not None
    assert settings.http_token.get_secret_value() == token
    assert settings.resume_secret.get_secret_value() == secret
