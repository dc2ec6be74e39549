"""Durable sleep: a sleep step ends its segment and the run waits on a timer.

The worker reaches the sleep step and reports the segment suspended there: with
no request for a fixed duration (the wake time is now + the duration, taken here),
or with one, the wake time the step's function computed (epoch ms as JSON, or
null: no sleep). ``SleepStarted`` fixes the wake time in the journal, so a restart
or a replay never measures it again; its timer (kind ``sleep``) is derived from
the state like every other (``due.py``). When it fires, ``SleepCompleted``: the
sleep step completes with its input (the previous step's output) and the next
segment begins. Stop intent (cancel, the run deadline) fences a sleep like any
wait (``reduce``: phase ``sleeping`` becomes ``idle``). Pure: no clock, no I/O.
"""

from __future__ import annotations

import json

from processor.facts import keys
from processor.facts.models import SegmentResult, SleepCompleted, SleepStarted
from processor.model import waits
from processor.model.decision import FactMaker
from processor.model.due import DueEntry
from processor.model.pipeline_spec import PipelineSpec, SleepSpec
from processor.model.state import RunState
from processor.model.transitions import continue_after

__all__ = ["sleep_due", "start_sleep", "wake_problem", "wake_up"]


def wake_problem(result: SegmentResult, sleep: SleepSpec) -> str:
    """What is wrong with a sleep step's suspended result ('' if nothing)."""
    if sleep.duration_ms is not None:
        return "" if not result.requests else "a sleep step for a duration sends no requests"
    if len(result.requests) != 1:
        return f"a sleep_until step sends one wake time, got {len(result.requests)}"
    try:
        wake = json.loads(result.requests[0])
    except ValueError:
        return "the wake time is not JSON"
    if wake is not None and (type(wake) is not int or wake < 0):
        return f"the wake time must be epoch milliseconds (>= 0) or null, got {wake!r}"
    return ""


def start_sleep(maker: FactMaker, spec: PipelineSpec, result: SegmentResult) -> None:
    """SleepStarted at the attempt's sleep step; it wakes at once if its time has passed."""
    state = maker.current
    step = state.attempt.next_step
    sleep = spec.steps[step].sleeps
    assert sleep is not None
    wake_ms = _wake_ms(sleep, result, maker.now)
    maker.add(
        SleepStarted(
            **maker.header(keys.sleep_started(state.attempt.segment)),
            segment=state.attempt.segment,
            attempt=state.attempt.number,
            generation=state.attempt.generation,
            step=step,
            wake_ms=wake_ms,
        )
    )
    if wake_ms <= maker.now:
        wake_up(maker, spec)


def _wake_ms(sleep: SleepSpec, result: SegmentResult, now: int) -> int:
    if sleep.duration_ms is not None:
        return now + sleep.duration_ms
    wake = json.loads(result.requests[0])  # checked by wake_problem
    return now if wake is None else int(wake)


def sleep_due(state: RunState, entry: DueEntry, now: int) -> bool:
    """Whether the sleep timer ``entry`` is the run's current sleep's, and due."""
    sleep = state.sleep
    if waits.of(state) is not waits.SLEEPING or sleep.wake_ms is None or now < sleep.wake_ms:
        return False
    return (entry.scope, entry.ordinal) == (state.attempt.segment, sleep.step)


def wake_up(maker: FactMaker, spec: PipelineSpec) -> None:
    """SleepCompleted; the sleep step completes with its input; the next segment begins."""
    state = maker.current
    step, wake_ms = state.sleep.step, state.sleep.wake_ms
    assert step is not None and wake_ms is not None
    segment = state.attempt.segment
    maker.add(
        SleepCompleted(
            **maker.header(keys.sleep_completed(segment)),
            segment=segment,
            step=step,
            wake_ms=wake_ms,
        )
    )
    continue_after(maker, spec, boundary=segment, step=step, output=state.last_output)
