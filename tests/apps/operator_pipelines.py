"""Pipelines for the operator CLI tests (history, requests, dlq, rejected pages):
load them with ``--app tests.apps.operator_pipelines:app``."""

from __future__ import annotations

from processor.worker.pipeline import Application
from tests.apps.boundary_pipelines import itemized, scalar
from tests.apps.pipelines import non_retryable, steps3

app = Application([steps3, non_retryable, scalar, itemized])
