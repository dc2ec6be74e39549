"""Three versions of two pipelines, for the definition_blocked and rolling deployment tests.

``greet`` v1, v2 and v3 each have one step that says which version ran it. The
processor's catalog and each worker's load a chosen subset (``application``), as
in a rolling deployment where old runs finish on the old version. ``relay`` waits at
an await first, so a run of it can sit between two segments across a deployment.

Processes load a release with ``--app tests.apps.version_pipelines:release2``:
release N loads versions 1 to N of both pipelines.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from processor.worker.pipeline import Application, Pipeline

__all__ = [
    "GATE_TIMEOUT_S",
    "RELAY_TARGET",
    "application",
    "greet",
    "relay",
    "release1",
    "release2",
    "release3",
]

#: How long a gated ``greet`` step waits for its gate file before it fails.
GATE_TIMEOUT_S = 120.0
RELAY_TARGET = "relay"


def greet(version: int) -> Pipeline:
    """Version ``version`` of ``greet``: its step adds ``{"ran": version}``.

    An input with ``began`` and ``gate`` (file paths) holds the step in flight: it
    creates ``began``, then waits until ``gate`` exists (up to ``GATE_TIMEOUT_S``).
    """
    pipeline = Pipeline("greet", version=version)

    @pipeline.step(name="hello", timeout_s=600.0)
    def hello(value: dict[str, Any]) -> dict[str, Any]:
        if "gate" in value:
            _hold_until(Path(value["began"]), Path(value["gate"]))
        return {**value, "ran": version}

    return pipeline


def _hold_until(began: Path, gate: Path) -> None:
    began.touch()
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while not gate.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{gate} did not appear in {GATE_TIMEOUT_S}s")
        time.sleep(0.01)  # the poll interval of a deadline-bounded wait


def relay(version: int) -> Pipeline:
    """Version ``version`` of ``relay``: an await on ``RELAY_TARGET`` (the request says
    the version that asked), then ``finish``: ``{"answer": <completion>, "ran": version}``."""
    pipeline = Pipeline("relay", version=version)

    @pipeline.await_step(name="ask", target=RELAY_TARGET, timeout_s=600.0)
    def ask(value: dict[str, Any]) -> dict[str, Any]:
        return {**value, "asked": version}

    @pipeline.step(name="finish", timeout_s=600.0)
    def finish(answer: Any) -> dict[str, Any]:
        return {"answer": answer, "ran": version}

    return pipeline


def application(*versions: int) -> Application:
    """An application loading these versions of ``greet``."""
    return Application([greet(v) for v in versions])


def _release(last: int) -> Application:
    return Application([make(v) for make in (greet, relay) for v in range(1, last + 1)])


release1 = _release(1)
release2 = _release(2)
release3 = _release(3)
