"""Pipelines for the sleep and retry-reason tests (``--app tests.apps.sleep_pipelines:app``).

- ``nap``: ``prepare``, a sleep of ``NAP_S`` seconds, then ``ship``, which receives
  what ``prepare`` returned.
- ``alarm``: ``prepare``, a sleep until the input's ``wake_ms`` (``sleep_until``),
  then ``ring``.
- ``doze``: ``wind_down``, a sleep of ``DOZE_S`` seconds (short: real processes sleep
  it in the kill -9 test), then ``wake``.
- ``picky``: ``judge`` raises NonRetryableError when the input says ``reject``, a
  retryable error when it says ``flaky`` (``PICKY_RETRY``: two attempts).
"""

from __future__ import annotations

from typing import Any

from processor.model.pipeline_spec import RetryPolicy
from processor.worker.pipeline import Application, NonRetryableError, Pipeline

__all__ = ["DOZE_S", "NAP_S", "PICKY_RETRY", "app"]

NAP_S = 30.0
DOZE_S = 5.0
PICKY_RETRY = RetryPolicy(max_attempts=2, initial_backoff_ms=10, max_backoff_ms=10)

nap = Pipeline("nap")


@nap.step(timeout_s=5)
def prepare(value: dict[str, Any]) -> dict[str, Any]:
    return {**value, "prepared": True}


nap.sleep(NAP_S, name="nap")


@nap.step(timeout_s=5)
def ship(value: dict[str, Any]) -> dict[str, Any]:
    return {"shipped": value}


alarm = Pipeline("alarm")


@alarm.step(name="prepare", timeout_s=5)
def prepare_alarm(value: dict[str, Any]) -> dict[str, Any]:
    return {**value, "set": True}


@alarm.sleep_until()
def until_wake(value: dict[str, Any]) -> int:
    return int(value["wake_ms"])


@alarm.step(timeout_s=5)
def ring(value: dict[str, Any]) -> dict[str, Any]:
    return {"rang": value}


doze = Pipeline("doze")


@doze.step(timeout_s=5)
def wind_down(value: dict[str, Any]) -> dict[str, Any]:
    return {**value, "wound_down": True}


doze.sleep(DOZE_S, name="doze")


@doze.step(timeout_s=5)
def wake(value: dict[str, Any]) -> dict[str, Any]:
    return {"awake": value}


picky = Pipeline("picky")


@picky.step(retry=PICKY_RETRY, timeout_s=5)
def judge(value: dict[str, Any]) -> dict[str, Any]:
    if value.get("reject"):
        raise NonRetryableError("rejected for good")
    if value.get("flaky"):
        raise RuntimeError("try again")
    return value


app = Application([nap, alarm, doze, picky])
