"""Pipelines for the end-to-end step runtime tests (a real processor with real workers).

Steps run in the test's own process (``Host`` worker threads), so they record what
they saw in ``SEEN`` (by the input's ``id``) and block on ``RELEASE`` where a test
needs a step that hangs; the test sets ``RELEASE`` when it is done with it.

- ``e2e_beating``: ``beat`` heartbeats for ``BEAT_FOR_S`` and then hangs (its first
  call for an id only; a retry returns at once). One attempt, a ``BEAT_TIMEOUT_S``
  heartbeat timeout and a long ``LONG_TIMEOUT_S`` timeout.
- ``e2e_queued``: ``pay`` is effectful, takes ``QUEUED_STEP_S``, with a timeout of
  ``QUEUED_TIMEOUT_S``: far less than the time a run waits behind the others.
- ``e2e_cancellable``: ``until_stopped`` loops until ``ctx.stop_requested`` (or
  ``RELEASE``).
- ``e2e_effectful``: ``charge`` (effectful, ``CHARGE_TIMEOUT_S``) hangs; ``ship``
  follows in the same segment with a long timeout.
- ``e2e_keyed``: ``charge`` (async) fails its first attempt and records its context.
- ``e2e_slow``: ``linger`` (one attempt, ``SLOW_TIMEOUT_S``) waits for ``RELEASE``,
  at most 95 % of its timeout: a test releases it once it saw the deadline warning.
- ``e2e_quick``: one step that returns its input (the warm-up run).
- ``e2e_branches``: a graph: after ``split``, ``steady`` heartbeats for twice
  ``BEAT_TIMEOUT_S`` (its heartbeat timeout) and returns, while ``falls_silent``
  beside it does what ``beat`` does (heartbeats, then hangs; its retry returns);
  ``both`` joins them.
- ``e2e_mixed`` (the kill -9 test, in a ``processor run`` child process): ``fetch``
  (async, heartbeats, ``MIXED_STEP_S``), a sleep of ``MIXED_SLEEP_S``, then ``tally``
  (sync, heartbeats); the result is a function of the input alone.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from typing import Any

from processor import Application, Pipeline, RetryPolicy, StepContext

__all__ = [
    "BEAT_FOR_S",
    "BEAT_TIMEOUT_S",
    "CHARGE_TIMEOUT_S",
    "LONG_TIMEOUT_S",
    "MIXED_SLEEP_S",
    "MIXED_STEP_S",
    "QUEUED_STEP_S",
    "QUEUED_TIMEOUT_S",
    "RELEASE",
    "SEEN",
    "SLOW_TIMEOUT_S",
    "app",
    "expected_mixed_result",
]

BEAT_TIMEOUT_S = 2.0
BEAT_FOR_S = 1.5  # long enough for the processor to record a heartbeat (past half a timeout)
LONG_TIMEOUT_S = 60.0  # the timeout a heartbeat timeout must beat
QUEUED_STEP_S = 0.03
QUEUED_TIMEOUT_S = 1.0
CHARGE_TIMEOUT_S = 1.5
SLOW_TIMEOUT_S = 2.0
MIXED_STEP_S = 0.2
MIXED_SLEEP_S = 1.0
HANG_S = 30.0  # the most a hanging step waits for ``RELEASE``

#: What steps saw, by the input's id: dicts of context fields and events.
SEEN: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
#: Set by a test to let its hanging steps return.
RELEASE = threading.Event()


def _record(value: dict[str, Any], ctx: StepContext, **extra: Any) -> list[dict[str, Any]]:
    seen = SEEN[value["id"]]
    seen.append(
        {
            "run_id": ctx.run_id,
            "step": ctx.step,
            "attempt": ctx.attempt,
            "generation": ctx.generation,
            "operation_key": ctx.operation_key,
            "deadline_ms": ctx.deadline_ms,
            "at": time.monotonic(),
            **extra,
        }
    )
    return seen


beating = Pipeline("e2e_beating", version=1)


@beating.step(
    retry=RetryPolicy(max_attempts=1),
    timeout_s=LONG_TIMEOUT_S,
    heartbeat_timeout_s=BEAT_TIMEOUT_S,
)
def beat(value: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    if len(_record(value, ctx)) > 1:
        return {"id": value["id"], "generation": ctx.generation}
    until = time.monotonic() + BEAT_FOR_S
    while time.monotonic() < until:
        ctx.heartbeat({"alive": True})
        time.sleep(0.02)  # the step's own work between heartbeats
    RELEASE.wait(HANG_S)  # hangs: no more heartbeats
    return {"id": value["id"], "generation": ctx.generation}


queued = Pipeline("e2e_queued", version=1)


@queued.step(effectful=True, timeout_s=QUEUED_TIMEOUT_S)
def pay(value: dict[str, Any]) -> dict[str, Any]:
    time.sleep(QUEUED_STEP_S)  # the step's work
    return {"paid": value["id"]}


cancellable = Pipeline("e2e_cancellable", version=1)


@cancellable.step(timeout_s=LONG_TIMEOUT_S)
def until_stopped(value: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    _record(value, ctx, event="started")
    until = time.monotonic() + HANG_S
    while not ctx.stop_requested and not RELEASE.is_set() and time.monotonic() < until:
        time.sleep(0.01)  # the poll interval of a deadline-bounded loop
    _record(value, ctx, event="stopped", stop_requested=ctx.stop_requested)
    return {"stopped": ctx.stop_requested}


effectful = Pipeline("e2e_effectful", version=1)


@effectful.step(effectful=True, timeout_s=CHARGE_TIMEOUT_S)
def charge(value: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    _record(value, ctx)
    RELEASE.wait(HANG_S)
    return value


@effectful.step(timeout_s=LONG_TIMEOUT_S)
def ship(value: dict[str, Any]) -> dict[str, Any]:
    return value


keyed = Pipeline("e2e_keyed", version=3)


@keyed.step(retry=RetryPolicy(max_attempts=2, initial_backoff_ms=100))
async def reserve(value: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    _record(value, ctx)
    await asyncio.sleep(0.001)  # real I/O would be awaited here
    if ctx.attempt == 1:
        raise ConnectionError("inventory service unavailable")
    return {"id": value["id"], "key": ctx.operation_key}


slow = Pipeline("e2e_slow", version=1)


@slow.step(retry=RetryPolicy(max_attempts=1), timeout_s=SLOW_TIMEOUT_S)
def linger(value: dict[str, Any]) -> dict[str, Any]:
    RELEASE.wait(SLOW_TIMEOUT_S * 0.95)
    return value


quick = Pipeline("e2e_quick", version=1)


@quick.step()
def echo(value: Any) -> Any:
    return value


mixed = Pipeline("e2e_mixed", version=1)


@mixed.step(timeout_s=10, heartbeat_timeout_s=3)
async def fetch(value: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    for _ in range(4):
        await asyncio.sleep(MIXED_STEP_S / 4)  # I/O
        ctx.heartbeat()
    return {"n": value["n"], "fetched": True}


mixed.sleep(MIXED_SLEEP_S, name="pause")


@mixed.step(timeout_s=10, heartbeat_timeout_s=3)
def tally(value: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    ctx.heartbeat()
    return {**value, "total": value["n"] * 2}


def expected_mixed_result(n: int) -> dict[str, Any]:
    """What an ``e2e_mixed`` run with input ``{"n": n}`` returns."""
    return {"n": n, "fetched": True, "total": n * 2}


# --- a graph: one branch heartbeats past its heartbeat timeout, the other stops ----------

branches = Pipeline("e2e_branches", version=1)


@branches.step()
def split(value: dict[str, Any]) -> dict[str, Any]:
    return value


@branches.step(
    needs=["split"],
    retry=RetryPolicy(max_attempts=1),
    timeout_s=LONG_TIMEOUT_S,
    heartbeat_timeout_s=BEAT_TIMEOUT_S,
)
def steady(value: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    until = time.monotonic() + BEAT_TIMEOUT_S * 2  # outlives its heartbeat timeout
    while time.monotonic() < until:
        ctx.heartbeat({"alive": True})
        time.sleep(0.02)  # the step's own work between heartbeats
    return {"steady": ctx.generation}


@branches.step(
    needs=["split"],
    retry=RetryPolicy(max_attempts=1),
    timeout_s=LONG_TIMEOUT_S,
    heartbeat_timeout_s=BEAT_TIMEOUT_S,
)
def falls_silent(value: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    return beat(value, ctx)


@branches.step(needs=["steady", "falls_silent"])
def both(outputs: dict[str, Any]) -> dict[str, Any]:
    return outputs


app = Application([beating, queued, cancellable, effectful, keyed, slow, quick, mixed, branches])
