"""Attempts running in this process: what each reports, and what segments.control
tells them (stop notices, answers to their claims).

The reporting policy (``RunningAttempt``), the same for a compensator (its step's
heartbeat and schedule-to-start timeouts, its own timeout):

- a claim, for an attempt that must not run twice (``PipelineSpec.needs_claim``),
  before it runs: the worker runs it once the processor granted the claim
  (``model.claims``); the claim also reports its first step started. It is sent
  again every ``CLAIM_RESEND_MS`` while unanswered, with a warning (an answer the
  worker could not read, a processor down or of an older release).
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
the process, so a stop notice or a claim's answer reaches its attempt whichever
in-process worker consumed it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from processor.facts.models import ClaimReply, StopNotice, WorkItem
from processor.model.pipeline_spec import StepSpec
from processor.telemetry.logs import run_extra
from processor.telemetry.metrics import count_deadline_warning
from processor.transport.clock import Clock
from processor.worker.context import AttemptRef, ProgressReporter, StopFlag

__all__ = [
    "CLAIM_RESEND_MS",
    "RUNNING",
    "WARNING_FRACTION",
    "AttemptRegistry",
    "RunningAttempt",
    "ref_of",
]

logger = logging.getLogger(__name__)

#: The share of a step's timeout after which a deadline warning is logged.
WARNING_FRACTION = 0.75
#: How long a claim waits for its answer before it is sent again.
CLAIM_RESEND_MS = 5_000


def ref_of(item: WorkItem | StopNotice | ClaimReply) -> AttemptRef:
    """The attempt a work item starts, or a stop notice or a claim's answer is about."""
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


@dataclass(slots=True)
class _Claim:
    """An attempt's claim: who hears the answer, when it was last sent, when granted."""

    on_answer: Callable[[ClaimReply], None] | None  # None once answered
    sent_ms: int
    granted_ms: int | None = None


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
        self._claim: _Claim | None = None

    def claim(self, on_answer: Callable[[ClaimReply], None]) -> None:
        """Claim the attempt before it runs; ``on_answer`` gets the processor's answer
        (once, on the thread that read it: ``answered``)."""
        now = self._clock()
        with self._lock:
            self._claim = _Claim(on_answer, now)
            self._reporter.claim(self.ref, self.item.first_step, now)

    def answered(self, reply: ClaimReply) -> None:
        """An answer to a claim of this attempt: heard if it is this worker's claim."""
        with self._lock:
            claim = self._claim
            if claim is None or claim.on_answer is None:
                return  # no claim waits (answered already: a resent claim's answer)
            if reply.worker_id != self._reporter.worker_id:
                return  # another worker's claim of the same attempt
            on_answer, claim.on_answer = claim.on_answer, None
            if reply.granted:
                claim.granted_ms = self._clock()
        on_answer(reply)

    def step_began(self, index: int, spec: StepSpec) -> None:
        """A step (or compensator) of the attempt starts now."""
        now = self._clock()
        timeout_ms = spec.timeout_ms
        if self.item.kind == "compensate" and spec.compensation is not None:
            timeout_ms = spec.compensation.timeout_ms
        step = _Step(index, spec.name, timeout_ms, spec.heartbeat_timeout_ms, now)
        with self._lock:
            self._step = step
            claim = self._claim
            if claim is not None and claim.granted_ms is not None and index == self.item.first_step:
                # The granted claim recorded this step's start: its timers run from it.
                step.started_sent = True
                step.last_report_ms = claim.granted_ms
                return
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
        """Send what is due at ``now`` (a claim still unanswered, a late start report, a
        throttled heartbeat) and warn of a deadline near; the worker calls this every
        loop round."""
        with self._lock:
            self._claim_again(now)
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

    def _claim_again(self, now: int) -> None:
        claim = self._claim
        if claim is None or claim.on_answer is None or now - claim.sent_ms < CLAIM_RESEND_MS:
            return
        logger.warning(
            "no answer to the claim of attempt %s of run %s after %d ms: claiming again",
            self.item.attempt,
            self.item.run_id,
            now - claim.sent_ms,
            extra=run_extra(self.item.run_id, self.item.pipeline, None, self.item.attempt),
        )
        claim.sent_ms = now
        self._reporter.claim(self.ref, self.item.first_step, now)

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
    """The attempts running in this process, by attempt (thread-safe). One attempt may
    run twice at once here, when two in-process workers got its work item."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[AttemptRef, list[RunningAttempt]] = {}

    def add(self, attempt: RunningAttempt) -> None:
        with self._lock:
            self._running.setdefault(attempt.ref, []).append(attempt)

    def remove(self, attempt: RunningAttempt) -> None:
        with self._lock:
            running = self._running.get(attempt.ref, [])
            self._running[attempt.ref] = [a for a in running if a is not attempt]
            if not self._running[attempt.ref]:
                del self._running[attempt.ref]

    def stop(self, notice: StopNotice) -> bool:
        """Set the stop flag of the attempt ``notice`` names; whether it runs here."""
        found = self._of(ref_of(notice))
        for attempt in found:
            attempt.stop.set(notice.reason)
        return bool(found)

    def answer(self, reply: ClaimReply) -> None:
        """Hand the answer to a claim to the attempt it is about, if it runs here."""
        for attempt in self._of(ref_of(reply)):
            attempt.answered(reply)

    def _of(self, ref: AttemptRef) -> list[RunningAttempt]:
        with self._lock:
            return list(self._running.get(ref, ()))


RUNNING = AttemptRegistry()
