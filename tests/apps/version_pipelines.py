"""Three versions of one pipeline, for the definition_blocked tests.

``greet`` v1, v2 and v3 each have one step that says which version ran it. The
processor's catalog and each worker's load a chosen subset (``application``), as
in a rolling deployment where old runs finish on the old version.
"""

from __future__ import annotations

from typing import Any

from processor.worker.pipeline import Application, Pipeline

__all__ = ["application", "greet"]


def greet(version: int) -> Pipeline:
    """Version ``version`` of ``greet``: its step adds ``{"ran": version}``."""
    pipeline = Pipeline("greet", version=version)

    @pipeline.step(name="hello", timeout_s=600.0)
    def hello(value: dict[str, Any]) -> dict[str, Any]:
        return {**value, "ran": version}

    return pipeline


def application(*versions: int) -> Application:
    """An application loading these versions of ``greet``."""
    return Application([greet(v) for v in versions])
