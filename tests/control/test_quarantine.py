"""A decision that raises quarantines its run; the loop and the partition go on.

Issue 30 item 5, on both transports: a bug is injected into the timer decisions, the
fleet wake-up and an input's decision (monkeypatched, in this process's loop).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import SimpleNamespace

import pytest

from processor.clients.client import status_dict
from processor.engine.inputs import INPUTS, RunInput
from processor.facts.models import (
    CommandReply,
    RunQuarantined,
    RunReleased,
    SegmentResult,
    SubmitRun,
)
from processor.facts.topics import TopicName
from processor.model import decide as decide_module
from processor.model.decision import Context, Decision, FactMaker
from processor.model.pipeline_spec import PipelineSpec
from processor.model.state import RunState
from processor.model.timers import DueEntry
from processor.store.census import RunCensus
from processor.store.readers import open_readers
from processor.telemetry import metrics
from processor.web.collector import CensusCollector
from processor.web.context import Readiness
from processor.web.wiring import host_readiness
from tests.apps.control_pipelines import STEP_TIMEOUT_S
from tests.control.control_support import Control


class InjectedBugError(RuntimeError):
    """The defect a test plants in a decision."""


def _break_timers(monkeypatch: pytest.MonkeyPatch, victim: str) -> None:
    """Every timer decision of ``victim`` raises; other runs' timers decide as before."""
    for kind, decides in list(decide_module.TIMER_DECISIONS.items()):

        def broken(
            maker: FactMaker,
            spec: PipelineSpec,
            entry: DueEntry,
            ctx: Context,
            decides: Callable[[FactMaker, PipelineSpec, DueEntry, Context], None] = decides,
        ) -> None:
            if entry.run_id == victim:
                raise InjectedBugError(f"timer {entry.kind} of {entry.run_id} " + "x" * 5000)
            decides(maker, spec, entry, ctx)

        monkeypatch.setitem(decide_module.TIMER_DECISIONS, kind, broken)


def _quarantined(ctl: Control, run_id: str) -> RunState:
    return ctl.drive(
        lambda: (s := ctl.h.loop_state(run_id)) is not None and s.quarantine is not None and s,
        f"run {run_id} quarantined",
    )


def _counted(source: str) -> float:
    return metrics.DECISIONS_QUARANTINED.labels(source)._value.get()


def test_a_timer_decision_that_raises_quarantines_its_run_and_the_partition_goes_on(
    ctl: Control, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = ctl.submit("booking", {"order": "victim"})
    item = ctl.work(victim)  # started and never answered: its timeout will be due
    ctl.started(item)
    _break_timers(monkeypatch, victim)
    before = _counted("timer")
    ctl.advance_to(ctl.now + int(STEP_TIMEOUT_S * 1000) * 5)

    bystander = ctl.submit("booking", {"order": "bystander"})
    assert ctl.play(bystander).status == "succeeded"  # the loop and the partition go on

    state = _quarantined(ctl, victim)
    assert state.quarantine is not None and state.quarantine.source.startswith("timer:")
    fact = ctl.one(victim, RunQuarantined)
    assert fact.error_type == "InjectedBugError" and f"of {victim}" in fact.error
    assert len(fact.error) <= 1000  # capped
    assert _counted("timer") == before + 1
    assert ctl.due(victim) == []  # its timers stop: no hot loop of the same exception
    shown = status_dict(state)["quarantine"]
    assert shown["source"] == fact.source and shown["error_type"] == "InjectedBugError"
    ctl.settle()
    assert len(ctl.of(victim, RunQuarantined)) == 1
    assert victim in _ready(ctl).quarantined and _gauge(ctl)["quarantined"] >= 1
    assert victim in _recounted(ctl)  # from the store's index, as after a restart

    # A later input for the run is refused, with its bytes.
    _, record = ctl.result(item)
    refused = ctl.drive(lambda: ctl.h.rejected.find(record), "the result refused")
    assert refused.reason == "run_quarantined" and refused.original_value == record.value
    assert refused.run_id == victim

    # The fix is deployed; the operator releases the run: its timers fire again.
    monkeypatch.undo()
    reply = _release(ctl, victim)
    assert reply.created and reply.refusal is None
    assert ctl.one(victim, RunReleased).quarantined_seq == fact.seq
    assert ctl.state(victim).quarantine is None
    assert victim not in _ready(ctl).quarantined and victim not in _recounted(ctl)
    done = ctl.play_timed(victim, lambda: _succeeded(ctl, victim), f"{victim} succeeded")
    assert done.status == "succeeded"


def test_release_of_a_run_not_in_quarantine_is_refused(ctl: Control) -> None:
    run_id = ctl.submit("booking", {"order": "fine"})
    ctl.play(run_id)
    reply = _release(ctl, run_id)
    assert reply.refusal == "not_quarantined"
    assert _release(ctl, "no-such-run").refusal == "unknown_run"


def test_an_input_decision_that_raises_quarantines_its_run(
    ctl: Control, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = ctl.submit("booking", {"order": "victim"})
    item = ctl.work(victim)
    results = INPUTS[TopicName.RESULTS].entries
    real = results[SegmentResult]
    assert isinstance(real, RunInput)

    def broken(result: SegmentResult, state: RunState | None, ctx: Context) -> Decision:
        raise InjectedBugError("decide_result")

    monkeypatch.setitem(results, SegmentResult, RunInput(SegmentResult, broken))  # type: ignore[misc]
    _, record = ctl.result(item)
    refused = ctl.drive(lambda: ctl.h.rejected.find(record), "the result refused")
    assert refused.reason == "internal_error" and refused.original_value == record.value
    _quarantined(ctl, victim)
    fact = ctl.one(victim, RunQuarantined)
    assert fact.source == TopicName.RESULTS.value and fact.error == "decide_result"

    # A command for it is refused too (with a reply), until it is released.
    command = SubmitRun(
        command_id="again", run_id=victim, pipeline="booking", input=b"{}", submitted_ms=0
    )
    again = ctl.h.produce_model(TopicName.COMMANDS, victim, command)
    assert ctl.drive(lambda: ctl.h.rejected.find(again), "refused").reason == "run_quarantined"
    monkeypatch.undo()
    assert _release(ctl, victim).created
    _, record = ctl.result(item)  # the worker's redelivered result is decided now
    done = ctl.play_timed(victim, lambda: _succeeded(ctl, victim), f"{victim} succeeded")
    assert done.status == "succeeded"


def test_when_even_the_quarantine_fails_the_run_is_skipped_in_memory(
    ctl: Control, monkeypatch: pytest.MonkeyPatch
) -> None:
    from processor.model import quarantine

    victim = ctl.submit("booking", {"order": "victim"})
    ctl.started(ctl.work(victim))
    _break_timers(monkeypatch, victim)

    def broken_record(*args: object, **kwargs: object) -> Decision:
        raise InjectedBugError("the fold is broken too")

    monkeypatch.setattr(quarantine, "decide_quarantine", broken_record)
    before = metrics.QUARANTINE_FAILED._value.get()
    ctl.advance_to(ctl.now + int(STEP_TIMEOUT_S * 1000) * 5)
    bystander = ctl.submit("booking", {"order": "bystander"})
    assert ctl.play(bystander).status == "succeeded"
    ctl.drive(lambda: metrics.QUARANTINE_FAILED._value.get() > before, "the failure counted")
    ctl.settle()
    assert metrics.QUARANTINE_FAILED._value.get() == before + 1  # skipped: not retried
    assert victim in ctl.h.loop.skipped_runs and victim in _ready(ctl).skipped
    assert _gauge(ctl)["skipped"] >= 1
    assert ctl.state(victim).quarantine is None and not ctl.of(victim, RunQuarantined)


def _ready(ctl: Control) -> Readiness:
    """What /readyz says of the harness's loop."""
    host = SimpleNamespace(loop=ctl.h.loop, stop_event=threading.Event())
    ready = host_readiness(host)  # type: ignore[arg-type]
    assert ready.ready
    return ready


def _gauge(ctl: Control) -> dict[str, float]:
    """``processor_runs_quarantined`` as a scrape reads it, by state."""
    families = {f.name: f for f in CensusCollector(lambda: ctl.h.loop).collect()}
    samples = families["processor_runs_quarantined"].samples
    return {s.labels["state"]: s.value for s in samples}


def _recounted(ctl: Control) -> set[str]:
    stores = open_readers(ctl.h.deployment.settings.state_dir)
    try:
        return {run for store in stores for run in RunCensus.count_from(store).quarantined()}
    finally:
        for store in stores:
            store.close()


def _release(ctl: Control, run_id: str) -> CommandReply:
    client = ctl.client()
    reply: list[CommandReply | None] = []
    thread = threading.Thread(target=lambda: reply.append(client.release(run_id, wait_s=30)))
    thread.start()
    ctl.drive(lambda: not thread.is_alive(), f"release of {run_id} answered")
    thread.join()
    client.close()
    answer = reply[0]
    assert answer is not None
    return answer


def _succeeded(ctl: Control, run_id: str) -> RunState | None:
    state = ctl.h.loop_state(run_id)
    return state if state is not None and state.terminal else None
