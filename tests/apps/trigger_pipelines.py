"""Pipelines started by triggers on user topics; ``--app tests.apps.trigger_pipelines:app``.

- ``steps3`` (the steps of ``tests.apps.pipelines``): one run per record of
  ``<prefix>user.orders``, a JSON object ``{"n": <int>}``; the run input is
  ``{"n": n}``. A record that is not JSON is refused as undecodable; one without
  ``n`` makes the mapping raise (``KeyError``).
- ``unique``: one run per ``order_id`` of ``<prefix>user.unique``: records with
  the same field value start one run.

The prefix comes from ``TEST_TRIGGER_PREFIX`` (set by the test that starts the
processor process), so every test's user topics are its own.
"""

from __future__ import annotations

import json
import os
from typing import Any

from processor.config.settings import Settings
from processor.facts.models import SubmitRun
from processor.transport.base import Record
from processor.worker.pipeline import Application, Pipeline
from processor.worker.trigger import BUILTIN_DECODERS, Trigger, TriggerRecord, trigger_submit
from tests.apps.pipelines import FAST_RETRY, double, finish, parse

__all__ = ["ORDERS", "UNIQUE", "app", "expected_order_runs", "trigger_app"]

ORDERS = "user.orders"
UNIQUE = "user.unique"


def order_input(rec: TriggerRecord) -> dict[str, Any]:
    """The run input of an order record: its ``n`` (KeyError without one)."""
    return {"n": int(rec.json()["n"])}


def trigger_app(prefix: str) -> Application:
    """The application, its triggers reading ``prefix + ORDERS`` and ``prefix + UNIQUE``."""
    steps3 = Pipeline("steps3", trigger=Trigger(prefix + ORDERS, order_input))
    for step in (parse, double, finish):
        steps3.step(timeout_s=2, retry=FAST_RETRY)(step)
    unique = Pipeline("unique")
    unique.trigger(prefix + UNIQUE, idempotency_field="order_id")(lambda rec: rec.decoded)
    unique.step(timeout_s=2, retry=FAST_RETRY)(_echo)
    return Application([steps3, unique])


def expected_order_runs(prefix: str, records: list[Record]) -> dict[str, int]:
    """Run id -> n of each well-formed ``ORDERS`` record, as the processor must derive them."""
    (trigger,) = [t for name, t in trigger_app(prefix).triggers if name == "steps3"]
    decoder = BUILTIN_DECODERS["json"](Settings())
    expected = {}
    for r in records:
        rec = TriggerRecord(r.topic, r.partition, r.offset, r.key, r.value)
        command = trigger_submit("steps3", trigger, decoder, rec, 0)
        if isinstance(command, SubmitRun):
            expected[command.run_id] = int(json.loads(command.input)["n"])
    return expected


def _echo(value: Any) -> Any:
    return value


app = trigger_app(os.environ.get("TEST_TRIGGER_PREFIX", ""))
