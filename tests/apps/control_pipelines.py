"""Pipelines for the run-control tests; load them with ``--app tests.apps.control_pipelines:app``.

Every behaviour is chosen by the run input, so a test (or a process killed and
restarted) needs no shared state; what a compensator undid is visible in the
journal as ``CompensationStepCompleted`` facts (and what it skipped as
``CompensationStepSkipped``).

- ``booking``: ``reserve`` and ``charge`` have compensators, ``notify`` and
  ``confirm`` do not. Input flags: ``transient`` (``reserve`` raises a retryable
  error, every attempt), ``reject`` (``confirm`` raises NonRetryableError, so the
  run fails after three steps completed), ``refund_fails`` (the compensator of
  ``charge`` raises a retryable error, every attempt). Forward steps retry by
  ``FORWARD_RETRY``; compensators by their own, different, ``COMPENSATION_RETRY``.
- ``payment``: ``authorize`` is ``effectful=True`` (a lost attempt becomes
  Unknown) and has a compensator; ``ship`` follows.
- ``timed``: a pipeline ``deadline_s`` (``TIMED_DEADLINE_S``); ``hold`` (with a
  compensator; ``transient`` makes it raise a retryable error), then an await on
  target ``clerk`` that only a test answers, then ``finish``.
- ``approval``: ``hold`` (with a compensator), a scalar await on target
  ``approvals``, then ``finish``.
- ``survey``: an itemized await on target ``approvals`` (one question per item),
  then ``tally``.
- ``watched``: ``crunch`` (one attempt, a heartbeat timeout ``HEARTBEAT_TIMEOUT_S``
  and a schedule-to-start timeout ``START_TIMEOUT_S``), then ``report``.
- ``undone``: ``lease`` (one attempt, a heartbeat timeout ``HEARTBEAT_TIMEOUT_S`` and
  a schedule-to-start timeout ``START_TIMEOUT_S``, which its compensator ``unlease``
  has too, with a compensation timeout ``UNDO_TIMEOUT_S``), then ``settle``, which
  refuses (NonRetryableError): every run unwinds ``lease``.
- ``lingering``: ``linger`` touches the file named by ``marker``, then sleeps
  ``sleep_s`` seconds (one attempt, a ``LINGER_TIMEOUT_S`` timeout).
- ``charging``: ``charge_card`` is ``effectful=True`` (one attempt, a
  ``CHARGE_TIMEOUT_S`` timeout, longer than a worker's session timeout on either
  transport): it appends a line naming the input's ``id`` and its pid to the file
  named by ``ledger`` (the charge), then holds for ``hold_s`` seconds.
  ``tallying``'s ``tally_card`` does the same as a plain step.
- ``mend``: ``intake``, ``check``, ``send``; ``check`` raises a retryable error
  (``MEND_RETRY``: a small budget) until the file named by the input's ``gate``
  exists, so the run fails, and a redrive after the file is created succeeds. Each
  step adds its name to the value's ``trail``; ``send`` takes ``send_s`` seconds.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from processor.model.pipeline_spec import RetryPolicy
from processor.worker.pipeline import Application, NonRetryableError, Pipeline

__all__ = [
    "APPROVALS",
    "AWAIT_TIMEOUT_S",
    "CHARGE_TIMEOUT_S",
    "CLERK",
    "COMPENSATION_RETRY",
    "COMPENSATION_TIMEOUT_S",
    "FORWARD_RETRY",
    "HEARTBEAT_TIMEOUT_S",
    "LINGER_TIMEOUT_S",
    "MEND_RETRY",
    "PAYMENT_TIMEOUT_S",
    "START_TIMEOUT_S",
    "STEP_TIMEOUT_S",
    "TIMED_DEADLINE_S",
    "UNDO_TIMEOUT_S",
    "WATCHED_TIMEOUT_S",
    "app",
    "expected_approval_result",
    "expected_booking_result",
    "expected_survey_result",
    "ledger_lines",
]

# The forward policy and the compensators' policy differ in every field, so a test
# can tell which one the engine applied.
# Forward steps get a large budget: a processor killed again and again may lose several
# attempts of one run (see ``STEP_TIMEOUT_S``).
FORWARD_RETRY = RetryPolicy(
    max_attempts=20, initial_backoff_ms=100, multiplier=2.0, max_backoff_ms=800
)
COMPENSATION_RETRY = RetryPolicy(
    max_attempts=3, initial_backoff_ms=250, multiplier=3.0, max_backoff_ms=5_000
)
# Short timeouts: on the embedded log, work claimed by the workers of a killed process
# may be lost, and only its attempt's timeout brings it back (a lost compensator attempt
# that a worker reported started becomes Unknown at its timeout and waits for an
# operator).
STEP_TIMEOUT_S = 2.0
COMPENSATION_TIMEOUT_S = 5.0  # longer than the run deadline of ``timed``
PAYMENT_TIMEOUT_S = 5.0
TIMED_DEADLINE_S = 3.0
AWAIT_TIMEOUT_S = 600.0  # longer than any test: only stop intent closes these interactions
APPROVALS = "approvals"
CLERK = "clerk"


class TransientError(RuntimeError):
    """A retryable failure."""


# --- booking: compensators on some steps, none on others ---------------------------------

booking = Pipeline("booking")


@booking.step(retry=FORWARD_RETRY, timeout_s=STEP_TIMEOUT_S)
def reserve(order: dict[str, Any]) -> dict[str, Any]:
    if order.get("transient"):
        raise TransientError("inventory service timed out")
    return {**order, "reserved": True}


@booking.step(retry=FORWARD_RETRY, timeout_s=STEP_TIMEOUT_S)
def charge(order: dict[str, Any]) -> dict[str, Any]:
    return {**order, "charged": order.get("amount", 10)}


@booking.step(retry=FORWARD_RETRY, timeout_s=STEP_TIMEOUT_S)
def notify(order: dict[str, Any]) -> dict[str, Any]:
    return {**order, "notified": True}


@booking.step(retry=FORWARD_RETRY, timeout_s=STEP_TIMEOUT_S)
def confirm(order: dict[str, Any]) -> dict[str, Any]:
    if order.get("reject"):
        raise NonRetryableError("the supplier rejected the booking")
    return {**order, "confirmed": True}


@booking.compensate("reserve", retry=COMPENSATION_RETRY, timeout_s=COMPENSATION_TIMEOUT_S)
def release(order: dict[str, Any]) -> dict[str, Any]:
    return {"released": order.get("id")}


@booking.compensate("charge", retry=COMPENSATION_RETRY, timeout_s=COMPENSATION_TIMEOUT_S)
def refund(order: dict[str, Any]) -> dict[str, Any]:
    if order.get("refund_fails"):
        raise TransientError("the payment provider refused the refund")
    return {"refunded": order["charged"]}


def expected_booking_result(order: dict[str, Any]) -> dict[str, Any]:
    """What a successful ``booking`` run returns for ``order``."""
    return {
        **order,
        "reserved": True,
        "charged": order.get("amount", 10),
        "notified": True,
        "confirmed": True,
    }


# --- payment: an effectful step ----------------------------------------------------------

payment = Pipeline("payment")


@payment.step(effectful=True, timeout_s=PAYMENT_TIMEOUT_S, retry=FORWARD_RETRY)
def authorize(order: dict[str, Any]) -> dict[str, Any]:
    return {**order, "authorized": order.get("amount", 10)}


@payment.compensate("authorize", retry=COMPENSATION_RETRY, timeout_s=COMPENSATION_TIMEOUT_S)
def void(order: dict[str, Any]) -> dict[str, Any]:
    return {"voided": order.get("authorized")}


@payment.step(retry=FORWARD_RETRY, timeout_s=STEP_TIMEOUT_S)
def ship(order: dict[str, Any]) -> dict[str, Any]:
    return {"shipped": order}


# --- timed: a pipeline deadline, and an await only a test answers ------------------------

timed = Pipeline("timed", deadline_s=TIMED_DEADLINE_S)


@timed.step(retry=FORWARD_RETRY, timeout_s=STEP_TIMEOUT_S)
def hold(value: dict[str, Any]) -> dict[str, Any]:
    if value.get("transient"):
        raise TransientError("the hold service timed out")
    return {**value, "held": True}


@timed.await_step(target=CLERK, timeout_s=AWAIT_TIMEOUT_S)
def ask_clerk(value: dict[str, Any]) -> dict[str, Any]:
    return {"please_approve": value.get("id")}


@timed.step(retry=FORWARD_RETRY, timeout_s=STEP_TIMEOUT_S)
def finish_timed(answer: Any) -> dict[str, Any]:
    return {"clerk_said": answer}


@timed.compensate("hold", retry=COMPENSATION_RETRY, timeout_s=COMPENSATION_TIMEOUT_S)
def unhold(value: dict[str, Any]) -> dict[str, Any]:
    return {"unheld": value.get("id")}


# --- approval: a scalar await ------------------------------------------------------------

approval = Pipeline("approval")


@approval.step(retry=FORWARD_RETRY, timeout_s=STEP_TIMEOUT_S)
def place_hold(value: dict[str, Any]) -> dict[str, Any]:
    return {**value, "held": True}


@approval.await_step(target=APPROVALS, timeout_s=AWAIT_TIMEOUT_S)
def ask_approval(value: dict[str, Any]) -> dict[str, Any]:
    return {"approve": value["n"]}


@approval.step(retry=FORWARD_RETRY, timeout_s=STEP_TIMEOUT_S)
def finish_approval(answer: Any) -> dict[str, Any]:
    return {"approved": answer}


@approval.compensate("place_hold", retry=COMPENSATION_RETRY, timeout_s=COMPENSATION_TIMEOUT_S)
def release_hold(value: dict[str, Any]) -> dict[str, Any]:
    return {"released": value.get("n")}


def expected_approval_result(answer: Any) -> dict[str, Any]:
    """What an ``approval`` run returns when its interaction was completed with ``answer``."""
    return {"approved": answer}


# --- survey: an itemized await -----------------------------------------------------------

survey = Pipeline("survey")


@survey.await_step(target=APPROVALS, timeout_s=AWAIT_TIMEOUT_S, itemized=True)
def ask_each(value: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"approve": value["n"] * 100 + i} for i in range(value["items"])]


@survey.step(retry=FORWARD_RETRY, timeout_s=STEP_TIMEOUT_S)
def tally(answers: list[Any]) -> dict[str, Any]:
    return {"answers": answers}


def expected_survey_result(answers: list[Any]) -> dict[str, Any]:
    """What a ``survey`` run returns for its item answers (in item order)."""
    return {"answers": answers}


# --- mend: fails until its gate file exists (for redrive) ---------------------------------

MEND_RETRY = RetryPolicy(max_attempts=3, initial_backoff_ms=10, multiplier=1.0, max_backoff_ms=10)
mend = Pipeline("mend")


def _trail(value: dict[str, Any], step: str) -> dict[str, Any]:
    return {**value, "trail": [*value.get("trail", []), step]}


@mend.step(retry=MEND_RETRY, timeout_s=STEP_TIMEOUT_S)
def intake(value: dict[str, Any]) -> dict[str, Any]:
    return _trail(value, "intake")


@mend.step(retry=MEND_RETRY, timeout_s=STEP_TIMEOUT_S)
def check(value: dict[str, Any]) -> dict[str, Any]:
    if not Path(value["gate"]).exists():
        raise TransientError(f"gate {value['gate']} is closed")
    return _trail(value, "check")


@mend.step(retry=MEND_RETRY, timeout_s=STEP_TIMEOUT_S)
def send(value: dict[str, Any]) -> dict[str, Any]:
    time.sleep(value.get("send_s", 0))  # a slow last step: redriven runs stay in flight
    return _trail(value, "send")


# --- watched: heartbeats and a schedule-to-start timeout ----------------------------------

HEARTBEAT_TIMEOUT_S = 2.0
WATCHED_TIMEOUT_S = 60.0  # far longer than the heartbeat timeout
START_TIMEOUT_S = 5.0
watched = Pipeline("watched")


@watched.step(
    retry=RetryPolicy(max_attempts=1),  # one attempt: only infrastructure losses are retried
    timeout_s=WATCHED_TIMEOUT_S,
    heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
    schedule_to_start_timeout_s=START_TIMEOUT_S,
)
def crunch(value: dict[str, Any]) -> dict[str, Any]:
    return {**value, "crunched": True}


@watched.step(retry=FORWARD_RETRY, timeout_s=STEP_TIMEOUT_S)
def report(value: dict[str, Any]) -> dict[str, Any]:
    return {**value, "reported": True}


# --- undone: a compensator that heartbeats and has a schedule-to-start timeout -------------

UNDO_TIMEOUT_S = 60.0  # far longer than the heartbeat and schedule-to-start timeouts
undone = Pipeline("undone")


@undone.step(
    retry=RetryPolicy(max_attempts=1),
    timeout_s=STEP_TIMEOUT_S,
    heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,  # the compensator's timers are the step's
    schedule_to_start_timeout_s=START_TIMEOUT_S,
)
def lease(value: dict[str, Any]) -> dict[str, Any]:
    return {**value, "leased": True}


@undone.step(retry=RetryPolicy(max_attempts=1), timeout_s=STEP_TIMEOUT_S)
def settle(value: dict[str, Any]) -> dict[str, Any]:
    raise NonRetryableError("the lessor refused")


@undone.compensate("lease", retry=COMPENSATION_RETRY, timeout_s=UNDO_TIMEOUT_S)
def unlease(value: dict[str, Any]) -> dict[str, Any]:
    return {"unleased": value.get("n")}


# --- lingering: a step that takes a while, and says when it began ------------------------

LINGER_TIMEOUT_S = 120.0
lingering = Pipeline("lingering")


@lingering.step(retry=RetryPolicy(max_attempts=1), timeout_s=LINGER_TIMEOUT_S)
def linger(value: dict[str, Any]) -> dict[str, Any]:
    # A test waits for it (then kills the process); with pid_file, it says where the step ran.
    Path(value["marker"]).write_text(str(os.getpid()) if value.get("pid_file") else "")
    time.sleep(value.get("sleep_s", 0))
    return {**value, "lingered": True}


# --- charging: an effect that must happen once, and its plain twin -------------------------

# Longer than a lost worker's session (10 s on the embedded log, 6 s in the Kafka tests),
# so that its redelivered work item reaches another worker while the attempt is claimed.
CHARGE_TIMEOUT_S = 15.0
charging = Pipeline("charging")
tallying = Pipeline("tallying")


def _charge(order: dict[str, Any]) -> dict[str, Any]:
    with open(order["ledger"], "a") as ledger:  # one short append: one line per call
        ledger.write(f"{order['id']} {os.getpid()}\n")
    time.sleep(order.get("hold_s", 0))
    return {**order, "charged": True}


@charging.step(effectful=True, retry=RetryPolicy(max_attempts=1), timeout_s=CHARGE_TIMEOUT_S)
def charge_card(order: dict[str, Any]) -> dict[str, Any]:
    return _charge(order)


@tallying.step(retry=RetryPolicy(max_attempts=1), timeout_s=CHARGE_TIMEOUT_S)
def tally_card(order: dict[str, Any]) -> dict[str, Any]:
    return _charge(order)


def ledger_lines(ledger: Path) -> dict[str, int]:
    """How many times each ``id`` was charged, by the ledger file."""
    if not ledger.exists():
        return {}
    return dict(Counter(line.split()[0] for line in ledger.read_text().splitlines()))


app = Application(
    [
        booking,
        payment,
        timed,
        approval,
        survey,
        mend,
        watched,
        undone,
        lingering,
        charging,
        tallying,
    ]
)
