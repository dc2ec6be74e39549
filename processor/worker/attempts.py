"""Attempts running in this process: what each reports, and the stop notices they get.

The reporting policy (``RunningAttempt``), the same for a compensator (its step's
heartbeat and schedule-to-start timeouts, its own timeout):

- ``started`` for a step once it has run ``start_report_after_ms`` without finishing,
  or as soon as it starts when the step has a heartbeat or a schedule-to-start
  timeout (the processor's timer needs it); fast steps report nothing, so they
  cost the processor no fact.
- ``heartbeat`` from ``ctx.heartbeat()``, at most one per quarter of the step's
  heartbeat timeout (a throttled call's details are sent when the quarter is over);
  nothing for a step without a heartbeat timeout.
- a deadline warning (log event ``deadline_warning`` and the metric
  ``processor_step_deadline_warnings_total``) once an attempt of a step has used
  75 % of its timeout.

Times are the worker's clock (epoch ms). ``RUNNING`` holds every attempt running in
the process, so a stop notice reaches its attempt whichever in-process worker
consumed the notice.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from processor.facts.models import StopNotice, WorkItem
from processor.model.pipeline_spec import StepSpec
from processor.telemetry.logs import run_extra
from processor.telemetry.metrics import count_deadline_warning
from processor.transport.clock import Clock
from processor.worker.context import AttemptRef, ProgressReporter, StopFlag

__all__ = ["RUNNING", "WARNING_FRACTION", "AttemptRegistry", "RunningAttempt", "ref_of"]

logger = logging.getLogger(__name__)

#: The share of a step's timeout after which a deadline warning is logged.
WARNING_FRACTION = 0.75


def ref_of(item: WorkItem | StopNotice) -> AttemptRef:
    """The attempt a work item starts, or a stop notice is about."""
    return AttemptRef(item.run_id, item.kind, item.segment, item.attempt, item.generation)


@dataclass(slots=True)
class _Step:
    """The step an attempt is in, and what was reported about it."""

    index: int
    name: str
    timeout_ms: int
    heartbeat_timeout_ms: int | None
    began_ms: int
    started_sent: bool = False
    warned: bool = False
    last_report_ms: int | None = None
    pending_details: tuple[bytes | None] | None = None  # a throttled heartbeat to send


class RunningAttempt:
    """One attempt this worker runs: its stop flag and its reports (thread-safe)."""

    def __init__(
        self,
        item: WorkItem,
        reporter: ProgressReporter,
        clock: Clock,
        start_report_after_ms: int,
    ) -> None:
        self.item = item
        self.ref = ref_of(item)
        self.stop = StopFlag()
        self._reporter = reporter
        self._clock = clock
        self._start_report_after_ms = start_report_after_ms
        self._lock = threading.Lock()
        self._step: _Step | None = None

    def step_began(self, index: int, spec: StepSpec) -> None:
        """A step (or compensator) of the attempt starts now."""
        now = self._clock()
        timeout_ms = spec.timeout_ms
        if self.item.kind == "compensate" and spec.compensation is not None:
            timeout_ms = spec.compensation.timeout_ms
        step = _Step(index, spec.name, timeout_ms, spec.heartbeat_timeout_ms, now)
        with self._lock:
            self._step = step
            # The processor's heartbeat or schedule-to-start timer needs to know at once.
            eager = spec.heartbeat_timeout_ms or spec.schedule_to_start_timeout_ms
            if eager or self._start_report_after_ms == 0:
                self._send_started(step, now)

    def step_ended(self) -> None:
        """The current step returned or raised."""
        with self._lock:
            self._step = None

    def heartbeat(self, details: bytes | None) -> None:
        """``ctx.heartbeat(details)`` of the current step."""
        with self._lock:
            step = self._step
            if step is None or step.heartbeat_timeout_ms is None:
                return
            now = self._clock()
            if self._throttled(step, now):
                step.pending_details = (details,)
                return
            self._send_heartbeat(step, now, details)

    def check(self, now: int) -> None:
        """Send what is due at ``now`` (a late start report, a throttled heartbeat) and
        warn of a deadline near; the worker calls this every loop round."""
        with self._lock:
            step = self._step
            if step is None:
                return
            if not step.started_sent and now - step.began_ms >= self._start_report_after_ms:
                self._send_started(step, now)
            if step.pending_details is not None and not self._throttled(step, now):
                self._send_heartbeat(step, now, step.pending_details[0])
            if not step.warned and now - step.began_ms >= step.timeout_ms * WARNING_FRACTION:
                step.warned = True
                self._warn(step, now)

    def _throttled(self, step: _Step, now: int) -> bool:
        assert step.heartbeat_timeout_ms is not None
        last = step.last_report_ms
        return last is not None and now - last < step.heartbeat_timeout_ms / 4

    def _send_started(self, step: _Step, now: int) -> None:
        step.started_sent = True
        step.last_report_ms = now
        self._reporter.step_started(self.ref, step.index, now)

    def _send_heartbeat(self, step: _Step, now: int, details: bytes | None) -> None:
        step.pending_details = None
        step.last_report_ms = now
        self._reporter.heartbeat(self.ref, step.index, now, details)

    def _warn(self, step: _Step, now: int) -> None:
        count_deadline_warning(self.item.pipeline, step.name)
        used = now - step.began_ms
        logger.warning(
            "deadline_warning: step %r of run %s, attempt %s, has run %d ms of its %d ms timeout",
            step.name,
            self.item.run_id,
            self.item.attempt,
            used,
            step.timeout_ms,
            extra=run_extra(self.item.run_id, self.item.pipeline, step.index, self.item.attempt)
            | {"event": "deadline_warning"},
        )


class AttemptRegistry:
    """The attempts running in this process, by attempt (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[AttemptRef, RunningAttempt] = {}

    def add(self, attempt: RunningAttempt) -> None:
        with self._lock:
            self._running[attempt.ref] = attempt

    def remove(self, attempt: RunningAttempt) -> None:
        with self._lock:
            if self._running.get(attempt.ref) is attempt:
                del self._running[attempt.ref]

    def stop(self, notice: StopNotice) -> bool:
        """Set the stop flag of the attempt ``notice`` names; whether it runs here."""
        with self._lock:
            attempt = self._running.get(ref_of(notice))
        if attempt is None:
            return False
        attempt.stop.set(notice.reason)
        return True


RUNNING = AttemptRegistry()
