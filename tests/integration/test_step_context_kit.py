"""Steps that take a StepContext, sync and async, in the test kit: the operation key a
step passes downstream is the same on its retry."""

from __future__ import annotations

import asyncio
from typing import Any

from processor import LocalEnvironment, Pipeline, RetryPolicy, StepContext
from processor.facts.models import RetryScheduled
from processor.worker.pipeline import Application

BACKOFF_MS = 5_000
_charges: list[tuple[int, str, str]] = []

keyed = Pipeline("keyed", version=2)


@keyed.step(retry=RetryPolicy(max_attempts=2, initial_backoff_ms=BACKOFF_MS))
def charge(order: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    """Fails on its first attempt, as a flaky payment call would."""
    _charges.append((ctx.attempt, ctx.operation_key, ctx.run_id))
    if ctx.attempt == 1:
        raise ConnectionError("payment service unavailable")
    return {**order, "charge_key": ctx.operation_key}


@keyed.step()
async def confirm(order: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    await asyncio.sleep(0.001)  # real I/O would be awaited here
    return {**order, "confirmed_by": f"{ctx.pipeline}@{ctx.pipeline_version}:{ctx.step}"}


APP = Application([keyed])


def test_a_retried_step_keeps_its_operation_key_and_async_steps_run() -> None:
    _charges.clear()
    with LocalEnvironment(APP, concurrency=2) as env:
        run_id = env.submit("keyed", {"order": "o-1"})
        env.wait_fact(run_id, RetryScheduled)
        env.advance(BACKOFF_MS / 1000)
        result = env.wait(run_id)
    assert result.status == "succeeded"
    (first, second) = _charges
    assert (first[0], second[0]) == (1, 2)
    assert first[1] == second[1] == result.output["charge_key"]  # one key for both attempts
    assert first[2] == second[2] == run_id
    assert result.output["confirmed_by"] == "keyed@2:confirm"
