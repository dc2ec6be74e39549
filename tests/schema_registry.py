"""Where the registry tests find a Schema Registry (a helper module: no tests here).

In order: ``SCHEMA_REGISTRY_URL`` when set; the repository's
``compose/local-registry`` launcher (Apicurio Registry, no Docker needed,
idempotent). Without either, ``schema_registry_url()`` returns None so tests can
skip, except in CI (``CI=true``), where they must never be skipped and it raises.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

__all__ = ["LOCAL_REGISTRY", "schema_registry_url", "start_local_registry"]

REPO_ROOT = Path(__file__).resolve().parents[1]
LOCAL_REGISTRY = REPO_ROOT / "compose" / "local-registry"
_START_TIMEOUT_S = 900.0  # the first start downloads the registry

_failures: list[str] = []


def start_local_registry(env: dict[str, str] | None = None) -> str:
    """``compose/local-registry start`` with ``env``; its URL. Raises RuntimeError."""
    result = subprocess.run(
        [str(LOCAL_REGISTRY), "start"],
        cwd=REPO_ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=_START_TIMEOUT_S,
        check=False,
    )
    if result.returncode != 0 or not result.stdout.strip():
        tail = result.stderr.strip().splitlines()[-3:]
        raise RuntimeError(f"compose/local-registry start exited {result.returncode}: {tail}")
    return result.stdout.strip().splitlines()[-1]


@functools.cache
def schema_registry_url() -> str | None:
    """The URL of a running Confluent-compatible registry, or None (cached per process)."""
    configured = os.environ.get("SCHEMA_REGISTRY_URL", "").strip()
    if configured:
        return configured
    try:
        return start_local_registry()
    except (OSError, subprocess.TimeoutExpired, RuntimeError) as exc:
        _failures.append(str(exc))
    if os.environ.get("CI") == "true":
        raise RuntimeError(f"registry tests must not be skipped in CI: {_failures}")
    return None


def unavailable_reason() -> str:
    """Why no registry could be found (for skip messages)."""
    return (
        f"no schema registry: set SCHEMA_REGISTRY_URL or fix compose/local-registry ({_failures})"
    )
