"""The pipelines of the HTTP tests: the demo's orders (an await on ``payments``)
and one that always fails (a dead letter)."""

from __future__ import annotations

from processor.examples.demo import orders
from processor.worker.pipeline import Application
from tests.apps.pipelines import non_retryable

app = Application([orders, non_retryable])
