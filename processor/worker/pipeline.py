"""The pipeline definition API: named, versioned pipelines of ordered steps.

```python
orders = Pipeline("orders", version=1)

@orders.step(retry=RetryPolicy(max_attempts=5), timeout_s=10)
def validate(order: dict) -> dict: ...

@orders.step()
def charge(order: dict) -> dict: ...

app = Application([orders])
```

Each step is a plain function taking the previous step's output (the run input
for the first step) and returning a JSON-serializable value. Runs pin the
pipeline version at submit; several versions of one pipeline may be loaded so
runs started on an older version finish on it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from processor.errors import ConfigurationError, ProcessorError
from processor.model.pipeline_spec import PipelineSpec, RetryPolicy, StepSpec

__all__ = ["Application", "NonRetryableError", "Pipeline", "Step", "load_application"]

StepFunction = Callable[[Any], Any]


class NonRetryableError(ProcessorError):
    """Raise from a step to fail its run at once, without retries."""


@dataclass(frozen=True, slots=True)
class Step:
    spec: StepSpec
    function: StepFunction


class Pipeline:
    """A named, versioned, ordered list of steps."""

    def __init__(self, name: str, *, version: int = 1) -> None:
        if not name or version < 1:
            raise ConfigurationError("a pipeline needs a name and a version >= 1")
        self.name = name
        self.version = version
        self.steps: list[Step] = []

    def step(
        self,
        name: str | None = None,
        *,
        retry: RetryPolicy | None = None,
        timeout_s: float = 30.0,
    ) -> Callable[[StepFunction], StepFunction]:
        """Decorator appending a step; steps run in the order they are declared."""

        def register(function: StepFunction) -> StepFunction:
            spec = StepSpec(
                name=name or function.__name__,
                retry=retry or RetryPolicy(),
                timeout_ms=int(timeout_s * 1000),
            )
            self.steps.append(Step(spec, function))
            return function

        return register

    def spec(self) -> PipelineSpec:
        if not self.steps:
            raise ConfigurationError(f"pipeline {self.name!r} has no steps")
        return PipelineSpec(self.name, self.version, tuple(s.spec for s in self.steps))


class Application:
    """The pipelines one deployment runs; the processor's pipeline catalog."""

    def __init__(self, pipelines: Iterable[Pipeline]) -> None:
        self._pipelines: dict[tuple[str, int], Pipeline] = {}
        self._specs: dict[tuple[str, int], PipelineSpec] = {}
        self._latest: dict[str, int] = {}
        for pipeline in pipelines:
            key = (pipeline.name, pipeline.version)
            if key in self._pipelines:
                raise ConfigurationError(
                    f"pipeline {pipeline.name!r} v{pipeline.version} defined twice"
                )
            self._pipelines[key] = pipeline
            self._specs[key] = pipeline.spec()
            self._latest[pipeline.name] = max(pipeline.version, self._latest.get(pipeline.name, 0))

    def latest(self, name: str) -> PipelineSpec | None:
        version = self._latest.get(name)
        return None if version is None else self._specs[(name, version)]

    def get(self, name: str, version: int) -> PipelineSpec | None:
        return self._specs.get((name, version))

    def pipeline(self, name: str, version: int) -> Pipeline | None:
        return self._pipelines.get((name, version))

    @property
    def names(self) -> list[str]:
        return sorted(self._latest)


def load_application(target: str) -> Application:
    """Import ``module:attribute`` and check it is an Application."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"--app must look like module:attribute, got {target!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r}: {exc}") from exc
    app = getattr(module, attribute, None)
    if not isinstance(app, Application):
        raise ConfigurationError(f"{target} is not a processor Application")
    return app
