"""processor: durable, event-sourced pipelines on Kafka with RocksDB projections.

The public API; everything a user needs is importable from here:

```python
from processor import Application, Client, Pipeline, RetryPolicy

orders = Pipeline("orders", version=1)

@orders.step(retry=RetryPolicy(max_attempts=5))
def validate(order): ...

app = Application([orders])  # processor run --app mymodule:app

with Client() as client:     # the deployment Settings() names (the environment)
    run = client.submit("orders", {"order_id": "o-1"})
    print(client.wait(run.run_id, timeout_s=60))
```

Names are imported on first use, so ``import processor`` stays cheap (a CLI
start or ``processor.__version__`` does not load Kafka, Avro or RocksDB).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"  # the one version source: pyproject reads it (setuptools dynamic)

#: Each public name and the module that defines it.
_EXPORTS: dict[str, str] = {
    "Application": "processor.worker.pipeline",
    "Pipeline": "processor.worker.pipeline",
    "NonRetryableError": "processor.worker.pipeline",
    "StepContext": "processor.worker.context",
    "Trigger": "processor.worker.trigger",
    "TriggerRecord": "processor.worker.trigger",
    "RetryPolicy": "processor.model.pipeline_spec",
    "CheckpointSpec": "processor.model.pipeline_spec",
    "Client": "processor.clients.client",
    "SubmitReceipt": "processor.clients.client",
    "CompletionReceipt": "processor.clients.completion_receipt",
    "RunResult": "processor.clients.outcome",
    "Settings": "processor.config.settings",
    "ProcessorError": "processor.errors",
    "AppendConflictError": "processor.errors",
    "ConfigurationError": "processor.errors",
    "FactDecodeError": "processor.errors",
    "FencedError": "processor.errors",
    "SessionLostError": "processor.errors",
    "StoreFormatError": "processor.errors",
    "TransportError": "processor.errors",
    "UnknownPipelineError": "processor.errors",
    "UnknownRunError": "processor.errors",
    "WaitTimeoutError": "processor.errors",
    "LocalEnvironment": "processor.testing",
    "ManualClock": "processor.testing",
}

# A literal list, so that type checkers know what the package re-exports.
__all__ = [
    "AppendConflictError",
    "Application",
    "CheckpointSpec",
    "Client",
    "CompletionReceipt",
    "ConfigurationError",
    "FactDecodeError",
    "FencedError",
    "LocalEnvironment",
    "ManualClock",
    "NonRetryableError",
    "Pipeline",
    "ProcessorError",
    "RetryPolicy",
    "RunResult",
    "SessionLostError",
    "Settings",
    "StepContext",
    "StoreFormatError",
    "SubmitReceipt",
    "TransportError",
    "Trigger",
    "TriggerRecord",
    "UnknownPipelineError",
    "UnknownRunError",
    "WaitTimeoutError",
    "__version__",
]

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports
    from processor.clients.client import Client, SubmitReceipt
    from processor.clients.completion_receipt import CompletionReceipt
    from processor.clients.outcome import RunResult
    from processor.config.settings import Settings
    from processor.errors import (
        AppendConflictError,
        ConfigurationError,
        FactDecodeError,
        FencedError,
        ProcessorError,
        SessionLostError,
        StoreFormatError,
        TransportError,
        UnknownPipelineError,
        UnknownRunError,
        WaitTimeoutError,
    )
    from processor.model.pipeline_spec import CheckpointSpec, RetryPolicy
    from processor.testing import LocalEnvironment, ManualClock
    from processor.worker.context import StepContext
    from processor.worker.pipeline import Application, NonRetryableError, Pipeline
    from processor.worker.trigger import Trigger, TriggerRecord


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'processor' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
