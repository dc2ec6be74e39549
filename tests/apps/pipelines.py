"""Pipelines for the fault and CLI tests; load them with ``--app tests.apps.pipelines:app``.

- ``steps3``: three pure steps with short timeouts (2 s each, so a lost attempt
  is retried after 6 s) and fast backoff; its result is a function of its input,
  so a test can check every run's result.
- ``flaky``: three steps; the middle one fails ``fail_times`` times (default 1)
  for each ``key`` before succeeding. ``CALLS`` counts executions per (key, step)
  in this process, so a test can prove completed steps are not re-executed.
- ``always_fails``: the second step always raises (retryable, max_attempts=2), so
  the run ends in RunFailed with a runs.dlq record.
- ``non_retryable``: the first step raises NonRetryableError.
- ``patient``: one step with a long timeout, for tests that must not see timers.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from processor.model.pipeline_spec import RetryPolicy
from processor.worker.pipeline import Application, NonRetryableError, Pipeline

__all__ = [
    "ALWAYS_FAILS_ERROR",
    "CALLS",
    "FAST_RETRY",
    "app",
    "expected_steps3_result",
]

# Crashes may lose many attempts of one run: a large budget with a short, capped backoff.
FAST_RETRY = RetryPolicy(max_attempts=50, initial_backoff_ms=10, multiplier=2.0, max_backoff_ms=200)
ALWAYS_FAILS_ERROR = "downstream refused the request"

CALLS: Counter[tuple[str, str]] = Counter()
_calls_lock = threading.Lock()


def _count(key: str, step: str) -> int:
    """Record one execution of ``step`` for ``key``; return how many there were."""
    with _calls_lock:
        CALLS[(key, step)] += 1
        return CALLS[(key, step)]


# --- steps3 -------------------------------------------------------------------------------

steps3 = Pipeline("steps3", version=1)


@steps3.step(timeout_s=2, retry=FAST_RETRY)
def parse(value: dict[str, Any]) -> dict[str, Any]:
    return {"n": int(value["n"]), "trail": ["parse"]}


@steps3.step(timeout_s=2, retry=FAST_RETRY)
def double(value: dict[str, Any]) -> dict[str, Any]:
    return {**value, "doubled": value["n"] * 2, "trail": [*value["trail"], "double"]}


@steps3.step(timeout_s=2, retry=FAST_RETRY)
def finish(value: dict[str, Any]) -> dict[str, Any]:
    return {**value, "done": True, "trail": [*value["trail"], "finish"]}


def expected_steps3_result(n: int) -> dict[str, Any]:
    """What a ``steps3`` run with input ``{"n": n}`` returns."""
    return {"n": n, "doubled": 2 * n, "done": True, "trail": ["parse", "double", "finish"]}


# --- flaky --------------------------------------------------------------------------------

flaky = Pipeline("flaky", version=1)
_FLAKY_RETRY = RetryPolicy(max_attempts=3, initial_backoff_ms=50, max_backoff_ms=200)


class TransientError(RuntimeError):
    """A failure that goes away when retried."""


@flaky.step(timeout_s=2, retry=_FLAKY_RETRY)
def prepare(value: dict[str, Any]) -> dict[str, Any]:
    _count(value["key"], "prepare")
    return {**value, "prepared": True}


@flaky.step(timeout_s=2, retry=_FLAKY_RETRY)
def wobble(value: dict[str, Any]) -> dict[str, Any]:
    calls = _count(value["key"], "wobble")
    if calls <= int(value.get("fail_times", 1)):
        raise TransientError(f"transient failure {calls} for {value['key']}")
    return {**value, "wobbled": calls}


@flaky.step(timeout_s=2, retry=_FLAKY_RETRY)
def seal(value: dict[str, Any]) -> dict[str, Any]:
    _count(value["key"], "seal")
    return {**value, "sealed": True}


# --- always_fails and non_retryable ---------------------------------------------------------

always_fails = Pipeline("always_fails", version=1)


@always_fails.step(timeout_s=2, retry=RetryPolicy(max_attempts=2, initial_backoff_ms=10))
def accept(value: Any) -> Any:
    return value


@always_fails.step(
    timeout_s=2, retry=RetryPolicy(max_attempts=2, initial_backoff_ms=10, max_backoff_ms=50)
)
def call_downstream(value: Any) -> Any:
    raise RuntimeError(ALWAYS_FAILS_ERROR)


non_retryable = Pipeline("non_retryable", version=1)


@non_retryable.step(timeout_s=2, retry=RetryPolicy(max_attempts=5, initial_backoff_ms=10))
def reject(value: Any) -> Any:
    raise NonRetryableError(f"input {value!r} can never succeed")


# --- patient ------------------------------------------------------------------------------

patient = Pipeline("patient", version=1)


@patient.step(timeout_s=3600)
def echo(value: Any) -> Any:
    return value


app = Application([steps3, flaky, always_fails, non_retryable, patient])
