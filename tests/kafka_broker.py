"""Where the Kafka tests find a broker (a helper module: no tests here).

In order: ``KAFKA_BOOTSTRAP_SERVERS`` when set; a testcontainers Kafka when a
Docker engine answers; the repository's ``compose/local-kafka`` launcher (no
Docker needed, idempotent). Without any, ``kafka_bootstrap()`` returns None so
tests can skip, except in CI (``CI=true``), where Kafka tests must never be
skipped and it raises instead.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import subprocess
from pathlib import Path

__all__ = ["kafka_bootstrap", "unavailable_reason"]

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
LOCAL_KAFKA = REPO_ROOT / "compose" / "local-kafka"
LOCAL_BOOTSTRAP = f"127.0.0.1:{os.environ.get('LOCAL_KAFKA_PORT', '9092')}"  # the launcher's port
_DOCKER_INFO_TIMEOUT_S = 5.0
_LOCAL_KAFKA_TIMEOUT_S = 900.0  # the first start downloads the Kafka jars

_failures: list[str] = []


def unavailable_reason() -> str:
    """Why no broker could be found (for skip messages)."""
    tried = "; ".join(_failures) or "nothing tried yet"
    return (
        "no Kafka broker: set KAFKA_BOOTSTRAP_SERVERS, start Docker, or fix "
        f"compose/local-kafka ({tried})"
    )


@functools.cache
def kafka_bootstrap() -> str | None:
    """A bootstrap address of a running Kafka broker, or None (cached per process)."""
    configured = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    if configured:
        return configured
    bootstrap = _testcontainers() if _docker_answers() else None
    if bootstrap is None:
        bootstrap = _local_kafka()
    if bootstrap is None and os.environ.get("CI") == "true":
        raise RuntimeError(f"Kafka tests must not be skipped in CI: {unavailable_reason()}")
    return bootstrap


def _docker_answers() -> bool:
    try:
        result = subprocess.run(
            ["docker", "info"],
            capture_output=True,
            timeout=_DOCKER_INFO_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        _failures.append(f"docker: {exc}")
        return False
    if result.returncode != 0:
        _failures.append(f"docker info exited {result.returncode}")
    return result.returncode == 0


def _testcontainers() -> str | None:
    try:
        from testcontainers.kafka import KafkaContainer
    except ImportError as exc:
        _failures.append(f"testcontainers: {exc}")
        return None
    try:
        container = KafkaContainer().with_kraft()
        container.start()
    except Exception as exc:  # any failure to start means: try the next way
        _failures.append(f"testcontainers Kafka did not start: {exc}")
        return None
    atexit.register(container.stop)
    bootstrap: str = container.get_bootstrap_server()
    logger.info("Kafka tests use a testcontainers broker at %s", bootstrap)
    return bootstrap


def _local_kafka() -> str | None:
    try:
        result = subprocess.run(
            [str(LOCAL_KAFKA), "start"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=_LOCAL_KAFKA_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        _failures.append(f"compose/local-kafka: {exc}")
        return None
    if result.returncode != 0:
        tail = result.stderr.strip().splitlines()[-3:]
        _failures.append(f"compose/local-kafka start exited {result.returncode}: {tail}")
        return None
    url = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    bootstrap = url.removeprefix("kafka://") if url.startswith("kafka://") else LOCAL_BOOTSTRAP
    logger.info("Kafka tests use the compose/local-kafka broker at %s", bootstrap)
    return bootstrap
