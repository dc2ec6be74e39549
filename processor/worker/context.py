"""What a running step knows about itself: ``StepContext``.

A step function (or compensator, or await-step function) that declares a second
positional parameter receives a ``StepContext`` in it:

```python
@orders.step(timeout_s=60, heartbeat_timeout_s=10)
async def charge(order: dict, ctx: StepContext) -> dict:
    ctx.logger.info("charging")                    # a record about this run
    receipt = await payments.charge(order, idempotency_key=ctx.operation_key)
    ctx.heartbeat({"charged": receipt.id})        # still alive (throttled)
    if ctx.stop_requested:                          # the run was cancelled meanwhile
        ...
    return receipt.as_dict()
```

The worker reports what attempts do through a ``ProgressReporter`` (its claim of
an attempt, the step started, it heartbeats); ``processor.worker.progress`` implements it with
``AttemptProgress`` messages on segments.results.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

from processor.telemetry.logs import run_extra

__all__ = [
    "AttemptRef",
    "ProgressReporter",
    "StepContext",
    "StopFlag",
    "is_async",
    "operation_key",
    "wants_context",
]

#: The logger step code gets as ``ctx.logger`` (each record names the run).
STEP_LOGGER = "processor.step"


@dataclass(frozen=True, slots=True)
class AttemptRef:
    """Which attempt a report is about (the fields results carry)."""

    run_id: str
    kind: str
    segment: int
    attempt: int
    generation: int


class ProgressReporter(Protocol):
    """Where a worker reports what a running attempt does (the processor's timers use it)."""

    @property
    def worker_id(self) -> str:
        """The id the reports carry: the claimant a claim's answer names."""
        ...

    def claim(self, attempt: AttemptRef, step: int, at_ms: int) -> None:
        """Ask to run ``attempt`` from its first step ``step`` (answered by a ClaimReply)."""
        ...

    def step_started(self, attempt: AttemptRef, step: int, at_ms: int) -> None:
        """Step ``step`` of ``attempt`` has started (and has not finished)."""
        ...

    def heartbeat(self, attempt: AttemptRef, step: int, at_ms: int, details: bytes | None) -> None:
        """Step ``step`` of ``attempt`` is alive; ``details`` is JSON, or None."""
        ...


@dataclass(slots=True)
class StopFlag:
    """Set once a stop notice for the attempt arrived; shared by its steps' contexts.

    Set by the worker's thread, read by the step's (an attribute write is atomic)."""

    requested: bool = False
    reason: str = ""

    def set(self, reason: str) -> None:
        self.reason = reason
        self.requested = True

    def is_set(self) -> bool:
        return self.requested


HeartbeatSink = Callable[[bytes | None], None]
#: Where ``emit`` puts an event: (step index, topic, value, key).
EmitSink = Callable[[int, str, Any, "str | None"], None]


class StepContext:
    """The context of one step attempt; the second parameter of a step that declares one.

    Attributes:
        run_id: the run's id.
        pipeline: the pipeline's name; ``pipeline_version`` the version the run is pinned to.
        step: the step's name; ``step_index`` its position in the pipeline (0-based).
        kind: ``"forward"`` for a step, ``"compensate"`` for its compensator.
        attempt: the attempt number of this segment (1 for the first try).
        generation: the run's attempt generation (grows with every attempt of the run).
        operation_key: an opaque hex key, the same for every attempt of this step in
            this run (retries, redeliveries, redrives): pass it downstream as an
            idempotency key. A compensator's key differs from its step's.
        deadline_ms: the run's deadline (epoch ms), or None.
        logger: a logger whose records carry this run's id, pipeline, step and attempt.
    """

    __slots__ = (
        "_emit",
        "_heartbeat",
        "_stop",
        "attempt",
        "deadline_ms",
        "generation",
        "kind",
        "logger",
        "operation_key",
        "pipeline",
        "pipeline_version",
        "run_id",
        "step",
        "step_index",
    )

    def __init__(
        self,
        *,
        run_id: str,
        pipeline: str,
        pipeline_version: int,
        step: str,
        step_index: int,
        attempt: int,
        generation: int,
        kind: str = "forward",
        deadline_ms: int | None = None,
        stop: StopFlag | None = None,
        heartbeat: HeartbeatSink | None = None,
        emit: EmitSink | None = None,
    ) -> None:
        self.run_id = run_id
        self.pipeline = pipeline
        self.pipeline_version = pipeline_version
        self.step = step
        self.step_index = step_index
        self.kind = kind
        self.attempt = attempt
        self.generation = generation
        self.deadline_ms = deadline_ms
        self.operation_key = operation_key(run_id, step_index, kind)
        self.logger: logging.LoggerAdapter[logging.Logger] = logging.LoggerAdapter(
            logging.getLogger(STEP_LOGGER), run_extra(run_id, pipeline, step_index, attempt)
        )
        self._stop = stop if stop is not None else StopFlag()
        self._heartbeat = heartbeat
        self._emit = emit

    @property
    def stop_requested(self) -> bool:
        """Whether the run was asked to stop (cancelled, deadline) while this attempt runs.

        Cooperative: the step decides whether to return early, raise, or finish."""
        return self._stop.is_set()

    def heartbeat(self, details: Any = None) -> None:
        """Say the step is alive, with optional JSON-serializable ``details``.

        Throttled to one message per quarter of the step's heartbeat timeout; a cheap
        no-op for a step without one."""
        if self._heartbeat is not None:
            encoded = None if details is None else json.dumps(details).encode()
            self._heartbeat(encoded)

    def emit(self, topic: str, value: Any, *, key: str | None = None) -> None:
        """Emit ``value`` (JSON-serializable) as an event to ``topic``, a declared topic
        (``Pipeline(..., emits=[...])`` or ``PROCESSOR_EMIT_TOPICS``).

        The event is published once, in the transaction that records the step's result,
        and only if the step returns and its attempt's result is accepted. Its record is
        keyed by ``key`` (default: the run id) and carries an ``event-id`` header derived
        from the run, the step and the event's position among the step's emissions."""
        if self._emit is None or self.kind != "forward":
            raise RuntimeError("only a step of a running attempt can emit (not a compensator)")
        self._emit(self.step_index, topic, value, key)

    def __repr__(self) -> str:
        return (
            f"StepContext(run_id={self.run_id!r}, pipeline={self.pipeline!r}, "
            f"step={self.step!r}, attempt={self.attempt})"
        )


def operation_key(run_id: str, step_index: int, kind: str = "forward") -> str:
    """The key of one step's operation in one run: 32 hex digits, stable across attempts."""
    text = f"{len(run_id)}:{run_id}|{kind}|{step_index}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


@lru_cache(maxsize=1024)
def wants_context(function: Callable[..., Any]) -> bool:
    """Whether ``function`` declares a second positional parameter (or ``*args``)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: one argument
        return False
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
        return True
    return sum(1 for p in parameters if p.kind in _POSITIONAL) >= 2


@lru_cache(maxsize=1024)
def is_async(function: Callable[..., Any]) -> bool:
    """Whether calling ``function`` returns a coroutine (``async def``)."""
    return inspect.iscoroutinefunction(function)
