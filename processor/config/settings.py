"""One frozen settings object; environment prefix ``PROCESSOR_``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, SettingsConfigDict

from processor.errors import ConfigurationError

__all__ = [
    "HTTP_PORTS",
    "Settings",
    "default_of",
    "http_port_of",
    "kafka_bootstrap",
    "librdkafka_security",
    "schema_registry_config",
]


#: What a placeholder secret says (compared without case or punctuation): compose's and
#: the README's old example values, and their kin. A deployment never runs on one.
_PLACEHOLDER_WORDS = ("changeme", "replaceme", "placeholder", "notareal")


class Settings(BaseSettings):
    """Processor configuration. Every field can be set as ``PROCESSOR_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="PROCESSOR_", frozen=True, extra="ignore")

    broker: str | None = Field(
        default=None, description="kafka://host:port[,host:port]; unset means the embedded log"
    )
    data_dir: Path = Field(
        default=Path(".processor"), description="Embedded log and RocksDB stores"
    )
    group: str = Field(default="processor", description="Consumer group of the processors")
    worker_group: str = Field(default="processor-workers", description="Consumer group of workers")
    worker_announce_interval_ms: int = Field(
        default=5_000,
        ge=100,
        description="A worker announces the pipeline versions it loads at start, then this "
        "often, and when it stops; a processor forgets a worker not heard for 3 intervals "
        "and, after starting, waits one interval before it holds back a run whose version "
        "no live worker loads (phase definition_blocked)",
    )
    instance_id: str | None = Field(
        default=None,
        description="This processor's id (its Kafka transactional.id suffix); unset: one "
        "generated on first start and kept in the state directory",
    )
    topic_prefix: str = Field(default="", description="Prefix of every physical topic name")
    partitions: int = Field(default=4, ge=1, description="Partitions of topics created by us")
    topic_replication: int | None = Field(
        default=None,
        ge=1,
        description="Replicas of each Kafka topic created by us, capped by the brokers "
        "(default: topics.toml's, 3)",
    )
    topic_min_insync_replicas: int | None = Field(
        default=None,
        ge=1,
        description="min.insync.replicas of each Kafka topic created by us, capped as the "
        "replication is (default: topics.toml's, 2)",
    )
    max_batch: int = Field(default=500, ge=1, description="Input records per transaction")
    emit_topics: str = Field(
        default="",
        description="Comma-separated topics any pipeline's steps may emit events to "
        "(ctx.emit), besides those a pipeline declares (emits=[...]); created at start",
    )
    max_payload_bytes: int = Field(
        default=512 * 1024,
        ge=1,
        description="Largest run input, step output or completion payload (canonical JSON "
        "bytes); larger ones are refused (payload_too_large). Below Kafka's default 1 MiB "
        "message.max.bytes, to leave room for the fact or message that carries the payload",
    )
    worker_concurrency: int = Field(
        default=8,
        ge=1,
        description="Attempts one worker runs at once (processor worker --concurrency, and "
        "each in-process worker of processor run): async def steps on an event loop, sync "
        "steps on a pool of this many threads. A worker polls no more work than it can start",
    )
    worker_isolation: Literal["process", "thread"] = Field(
        default="process",
        description="Where processor run (and demo) runs its in-process workers: process, "
        "in one child process (off the processor's GIL; it ends with the processor); "
        "thread, as threads of the processor's own process",
    )
    inline_steps: bool = Field(
        default=False,
        description="The processor runs a segment of a pipeline its own application "
        "loads (processor run --app) before it commits, instead of sending a work item to "
        "a worker: what dispatched it, its steps' outputs and what follows commit together "
        "(two transactions for the standard run instead of four). For quick sync steps: "
        "they run on the processor's loop. Async, effectful (claimed) steps and other "
        "pipelines still go to workers",
    )
    fact_batches: bool = Field(
        default=False,
        description="The facts one transaction appends to a run leave as one record of "
        "runs.facts (a FactBatch) instead of one record each: a standard run writes 2-3 "
        "fact records instead of about 15. Every reader of this version expands them; "
        "turn it on once every processor, client and replay of the deployment runs a "
        "version that reads them, and not while a consumer of your own "
        "reads runs.facts record by record",
    )
    start_report_after_ms: int = Field(
        default=1000,
        ge=0,
        description="A worker reports that a step started (AttemptProgress on "
        "segments.results) once it has run this long without finishing; a step with a "
        "heartbeat timeout reports at once. Faster steps report nothing",
    )
    max_infrastructure_losses: int = Field(
        default=20,
        ge=0,
        description="Attempts a run may lose to the infrastructure (not started before "
        "their schedule-to-start timeout, heartbeats stopped, redelivered to another "
        "worker) without charging a step's retry budget; past it, a loss is a failure",
    )
    poll_timeout_ms: int = Field(default=50, ge=1)
    timer_interval_ms: int = Field(
        default=100, ge=1, description="Periodic due-work scan; a timer also fires when due"
    )
    timer_batch: int = Field(default=1000, ge=1, description="Due timers fired per scan")
    keep_runs: int = Field(
        default=4096,
        ge=0,
        description="Runs kept in memory per partition after they were written (the most "
        "recently written that have not ended), so that their next input skips the store "
        "read; 0: none",
    )
    stable_wait_ms: int = Field(
        default=120_000,
        ge=0,
        description="On assignment, how long to wait for a crashed writer's open transaction "
        "on runs.facts to be aborted before catching up (at least the transaction timeout "
        "plus the broker's abort sweep)",
    )
    parallel_restore_min_facts: int = Field(
        default=200_000,
        ge=1,
        description="A restore on assignment of this many facts or more, over several "
        "partitions, runs in one process per CPU",
    )
    native_fold: bool = Field(
        default=True,
        description="Restore and replay fold facts with the compiled fold (processor_native) "
        "when it is installed; false: always with the Python reducers",
    )
    durable_fsync: bool = Field(default=False, description="fsync every embedded-log commit")
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="Log records as text lines, or as one JSON object per line (time, level, "
        "logger, message, and run_id, pipeline, step, attempt on records about a run)",
    )
    otel: bool = Field(
        default=False,
        description="Emit OpenTelemetry spans (needs the otel extra): the CLI sets up an SDK "
        "tracer provider unless the program did; runs carry their traceparent either way",
    )
    resume_secret: SecretStr | None = Field(
        default=None,
        description="HMAC key of resume tokens and checkpoint handoffs (key id 'default'); "
        "required on Kafka unless resume_secrets is set, generated for the embedded log",
    )
    resume_secrets: SecretStr | None = Field(
        default=None,
        description="Several keys, for rotation: comma-separated kid:secret pairs; the first "
        "signs, every one verifies; a token or handoff of a key no longer listed is refused. "
        "Instead of resume_secret, not with it",
    )
    kafka_session_timeout_ms: int = Field(
        default=10_000,
        ge=1,
        description="A processor or worker that stops heartbeating (crash, kill -9, SIGSTOP) "
        "loses its partitions after this (librdkafka heartbeats from a background thread, "
        "three times a session and at most every 3 s, so a slow batch does not count)",
    )
    kafka_max_poll_interval_ms: int = Field(
        default=300_000,
        ge=1,
        description="A member that stops polling (a hung loop) is evicted after this; "
        "raised to kafka_session_timeout_ms if lower",
    )
    kafka_transaction_timeout_ms: int = Field(
        default=10_000,
        ge=1,
        description="A transaction left open by a crashed processor is aborted by the broker "
        "after this (as Kafka Streams under exactly-once); until then read_committed "
        "readers cannot read past it. A transactional call that hangs for this plus 15 s "
        "is abandoned and the session replaced",
    )
    kafka_security_protocol: str | None = None
    kafka_sasl_mechanism: str | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_ca_location: str | None = None
    kafka_ssl_certificate_location: str | None = None
    kafka_ssl_key_location: str | None = None
    kafka_ssl_key_password: SecretStr | None = None
    schema_registry_url: str | None = Field(
        default=None,
        description="Confluent-compatible Schema Registry (e.g. http://host:8081, or "
        "Apicurio's .../apis/ccompat/v7); set: records use the Confluent wire format",
    )
    schema_registry_basic_auth: SecretStr | None = Field(
        default=None, description='Basic auth of the registry, "user:password"'
    )
    schema_registry_ssl_ca_location: str | None = None
    schema_registry_ssl_certificate_location: str | None = None
    schema_registry_ssl_key_location: str | None = None

    http_enabled: bool = Field(
        default=True,
        description="Serve metrics, health, the JSON API and the inspector page over HTTP "
        "(processor run; processor worker serves metrics and health only)",
    )
    http_host: str = Field(
        default="127.0.0.1",
        description="Address the HTTP server binds; off loopback every /api route needs "
        "the bearer token",
    )
    http_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="HTTP port; unset: 8700 for processor run, 8701 for processor worker; "
        "0: any free port (printed at start)",
    )
    http_token: SecretStr | None = Field(
        default=None,
        description="Bearer token of the HTTP API (Authorization: Bearer <token>): required "
        "for every POST and for GET /api/requests, and for every /api route off loopback",
    )

    @field_validator("broker")
    @classmethod
    def _broker_url(cls, value: str | None) -> str | None:
        if value in (None, "", "embedded"):
            return None
        if not value.startswith("kafka://") or not value.removeprefix("kafka://"):
            raise ValueError("broker must look like kafka://host:port[,host:port]")
        return value

    @field_validator("resume_secret", "resume_secrets", "http_token")
    @classmethod
    def _not_a_placeholder(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        """Refuse a secret everyone can read in an example: name the variable, not the value."""
        if value is not None and _is_placeholder(value.get_secret_value()):
            raise PydanticCustomError(
                "placeholder_secret",
                "{variable} is a placeholder, not a secret: set a random value of your own "
                "(for example `openssl rand -hex 32`)",
                {"variable": f"PROCESSOR_{(info.field_name or '').upper()}"},
            )
        return value

    @field_validator("schema_registry_url")
    @classmethod
    def _registry_url(cls, value: str | None) -> str | None:
        return (value.rstrip("/") or None) if value else None

    @property
    def declared_emit_topics(self) -> tuple[str, ...]:
        """``emit_topics`` as a sorted tuple of names."""
        return tuple(sorted({t.strip() for t in self.emit_topics.split(",") if t.strip()}))

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "log"

    @property
    def state_dir(self) -> Path:
        return self.data_dir / "state" / self.group


def _is_placeholder(secret: str) -> bool:
    letters = "".join(c for c in secret.lower() if c.isalnum())
    return any(word in letters for word in _PLACEHOLDER_WORDS)


#: ``http_port`` when it is unset, by command: the processor's, and a worker's.
HTTP_PORTS = {"run": 8700, "worker": 8701}


def http_port_of(settings: Settings, command: str) -> int:
    """The HTTP port of ``command`` ("run" or "worker"): the setting, else its default."""
    return settings.http_port if settings.http_port is not None else HTTP_PORTS[command]


def default_of(name: str) -> Any:
    """The declared default of one Settings field (ignoring the environment).

    For the few APIs below the settings (a transport, a topology, replay) that keep
    a default of their own: they take it from here, so each default exists once.
    """
    return Settings.model_fields[name].default


def kafka_bootstrap(settings: Settings) -> str:
    if settings.broker is None:
        raise ConfigurationError("no Kafka broker configured")
    return settings.broker.removeprefix("kafka://")


def librdkafka_security(settings: Settings) -> dict[str, str]:
    """Map the security settings to librdkafka's dotted keys (the one place that does)."""
    pairs = {
        "security.protocol": settings.kafka_security_protocol,
        "sasl.mechanism": settings.kafka_sasl_mechanism,
        "sasl.username": settings.kafka_sasl_username,
        "sasl.password": _secret(settings.kafka_sasl_password),
        "ssl.ca.location": settings.kafka_ssl_ca_location,
        "ssl.certificate.location": settings.kafka_ssl_certificate_location,
        "ssl.key.location": settings.kafka_ssl_key_location,
        "ssl.key.password": _secret(settings.kafka_ssl_key_password),
    }
    return {key: value for key, value in pairs.items() if value}


def schema_registry_config(settings: Settings) -> dict[str, str]:
    """The schema registry client's configuration (``SchemaRegistryClient`` keys)."""
    if settings.schema_registry_url is None:
        raise ConfigurationError("no schema registry configured (PROCESSOR_SCHEMA_REGISTRY_URL)")
    pairs = {
        "url": settings.schema_registry_url,
        "basic.auth.user.info": _secret(settings.schema_registry_basic_auth),
        "ssl.ca.location": settings.schema_registry_ssl_ca_location,
        "ssl.certificate.location": settings.schema_registry_ssl_certificate_location,
        "ssl.key.location": settings.schema_registry_ssl_key_location,
    }
    return {key: value for key, value in pairs.items() if value}


def _secret(value: SecretStr | None) -> str | None:
    return None if value is None else value.get_secret_value()
