"""Attempt progress as messages: ``AttemptProgress`` on segments.results, keyed by run id."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from processor.facts.codec import encode
from processor.facts.models import AttemptProgress
from processor.transport.base import Outbound
from processor.worker.context import AttemptRef

__all__ = ["ProducedProgress"]


class ProducedProgress:
    """A ``ProgressReporter`` that produces ``AttemptProgress`` through ``send``."""

    def __init__(
        self, send: Callable[[Outbound], None], results_topic: str, worker_id: str
    ) -> None:
        self._send = send
        self._topic = results_topic
        self._worker_id = worker_id

    @property
    def worker_id(self) -> str:
        return self._worker_id

    def claim(self, attempt: AttemptRef, step: int, at_ms: int) -> None:
        self._send(self._message(attempt, step, "started", at_ms, None, claim=True))

    def step_started(self, attempt: AttemptRef, step: int, at_ms: int) -> None:
        self._send(self._message(attempt, step, "started", at_ms, None))

    def heartbeat(self, attempt: AttemptRef, step: int, at_ms: int, details: bytes | None) -> None:
        self._send(self._message(attempt, step, "heartbeat", at_ms, details))

    def _message(
        self,
        attempt: AttemptRef,
        step: int,
        report: Literal["started", "heartbeat"],
        at_ms: int,
        details: bytes | None,
        *,
        claim: bool = False,
    ) -> Outbound:
        progress = AttemptProgress(
            run_id=attempt.run_id,
            kind=attempt.kind,
            segment=attempt.segment,
            attempt=attempt.attempt,
            generation=attempt.generation,
            step=step,
            report=report,
            worker_id=self._worker_id,
            at_ms=at_ms,
            details=details,
            claim=claim,
        )
        return Outbound(self._topic, attempt.run_id.encode(), encode(progress))
