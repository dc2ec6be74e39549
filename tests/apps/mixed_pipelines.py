"""A pipeline mixing async steps, a sleep and heartbeats, for the kill -9 test
(``--app tests.apps.mixed_pipelines:app``).

``mixed`` (input ``{"n": n}``), four steps in two segments:

- ``fetch``: an ``async def`` step awaiting a little I/O (``asyncio.sleep``, a few
  tens of ms); its output carries ``ctx.operation_key``.
- a sleep of ``NAP_S`` seconds (``nap``), which ends the first segment.
- ``crunch``: a sync step working ``BEATS`` x ``BEAT_S`` seconds and calling
  ``ctx.heartbeat`` after each piece, with a heartbeat timeout of
  ``HEARTBEAT_TIMEOUT_S``: it reports its start at once, so a kill -9 while it runs
  loses its attempt to the heartbeat timer (an infrastructure loss).
- ``settle``: fails (``HiccupError``, retryable) on the segment's first attempt when
  ``hiccups(n)``, and on every attempt when ``doomed(n)``: those runs fail with
  ``attempts_exhausted`` after ``SETTLE_RETRY.max_attempts``.

Every step's output is a function of ``n`` (and the run id), so a test can check
every result; ``expected_result`` says what a run that succeeded returns.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from processor import StepContext
from processor.model.pipeline_spec import RetryPolicy
from processor.worker.context import operation_key
from processor.worker.pipeline import Application, Pipeline

__all__ = [
    "BEATS",
    "CRUNCH_STEP",
    "HEARTBEAT_TIMEOUT_S",
    "SETTLE_RETRY",
    "HiccupError",
    "app",
    "doomed",
    "expected_result",
    "hiccups",
]

NAP_S = 1.0
BEATS, BEAT_S = 8, 0.1
HEARTBEAT_TIMEOUT_S = 1.0
#: A lost attempt is not charged to this budget; only ``HiccupError`` failures are.
SETTLE_RETRY = RetryPolicy(max_attempts=3, initial_backoff_ms=10, max_backoff_ms=50)
#: The index of ``crunch`` in the pipeline (fetch, nap, crunch, settle).
CRUNCH_STEP = 2


class HiccupError(RuntimeError):
    """A retryable failure of ``settle``."""


def hiccups(n: int) -> bool:
    """Whether run ``n``'s ``settle`` fails its first try (then succeeds)."""
    return n % 4 == 1


def doomed(n: int) -> bool:
    """Whether run ``n``'s ``settle`` fails every try (the run fails)."""
    return n % 20 == 13


mixed = Pipeline("mixed", version=1)


@mixed.step(timeout_s=10)
async def fetch(value: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    n = int(value["n"])
    await asyncio.sleep(0.02 + (n % 5) * 0.02)  # a downstream call, awaited
    return {"n": n, "fetched": f"item-{n}", "key": ctx.operation_key}


mixed.sleep(NAP_S, name="nap")


@mixed.step(timeout_s=10, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S)
def crunch(value: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    for beat in range(BEATS):
        time.sleep(BEAT_S)  # a piece of CPU-bound or blocking work
        ctx.heartbeat({"beat": beat})
    return {**value, "crunched": value["n"] * 3}


@mixed.step(timeout_s=5, retry=SETTLE_RETRY)
def settle(value: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    n = value["n"]
    if doomed(n) or (hiccups(n) and ctx.attempt == 1):
        raise HiccupError(f"settle {n} hiccuped on attempt {ctx.attempt}")
    return {**value, "settled": True}


def expected_result(run_id: str, n: int) -> dict[str, Any]:
    """What a ``mixed`` run of input ``{"n": n}`` returns when it succeeds."""
    key = operation_key(run_id, 0)
    return {"n": n, "fetched": f"item-{n}", "key": key, "crunched": 3 * n, "settled": True}


app = Application([mixed])
