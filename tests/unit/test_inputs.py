"""The table of the processor's inputs (``processor.engine.inputs``): each run-addressed
topic decodes its records and hands each kind of message to the entry that decides on
it, with the refusal policy of that entry."""

from __future__ import annotations

from typing import Any

import pytest

from processor.admission.admit import admit
from processor.admission.arrivals import Arrival, Refusal
from processor.clients.client import new_submit
from processor.engine.fleet import Fleet
from processor.engine.inputs import (
    INPUTS,
    FleetNews,
    RunInput,
    counted,
    decide_report,
    to_rejected,
)
from processor.errors import FactDecodeError
from processor.facts.codec import encode
from processor.facts.keyring import KeyRing
from processor.facts.models import (
    AttemptProgress,
    BoundaryCompletion,
    CancelRun,
    ClaimReply,
    LoadedPipeline,
    RedriveRun,
    ReleaseRun,
    ResolveAttempt,
    SegmentResult,
    SubmitRun,
    WorkerAnnouncement,
)
from processor.facts.topics import RUN_ADDRESSED_INPUTS, TopicName
from processor.model.decide import (
    Decision,
    decide_cancel,
    decide_redrive,
    decide_resolve,
    decide_result,
    decide_submit,
)
from processor.model.quarantine import decide_release
from processor.telemetry.metrics import REGISTRY
from processor.transport.base import Record
from tests.unit.test_progress import Run

KEYS = KeyRing.single(b"")


def _record(topic: TopicName, value: bytes, headers: tuple[tuple[str, bytes], ...] = ()) -> Record:
    return Record(topic.value, 2, 17, b"run", value, headers)


def _entry(topic: TopicName, message: object) -> RunInput[Any]:
    entry = INPUTS[topic].entry(message, None)
    assert isinstance(entry, RunInput)
    return entry


def _refused_progress(reason: str) -> float:
    value = REGISTRY.get_sample_value("processor_progress_refused_total", {"reason": reason})
    return value or 0.0


def _announcement() -> WorkerAnnouncement:
    loaded = (LoadedPipeline(name="fx", version=1),)
    return WorkerAnnouncement(worker_id="w1", group="g", pipelines=loaded, concurrency=4, at_ms=5)


def test_every_run_addressed_input_topic_has_its_entry() -> None:
    assert set(INPUTS) == set(RUN_ADDRESSED_INPUTS)
    assert all(source.topic is topic for topic, source in INPUTS.items())


@pytest.mark.parametrize(
    ("topic", "kind", "decide"),
    [
        (TopicName.COMMANDS, SubmitRun, decide_submit),
        (TopicName.COMMANDS, CancelRun, decide_cancel),
        (TopicName.COMMANDS, ResolveAttempt, decide_resolve),
        (TopicName.COMMANDS, RedriveRun, decide_redrive),
        (TopicName.COMMANDS, ReleaseRun, decide_release),
        (TopicName.RESULTS, SegmentResult, decide_result),
        (TopicName.RESULTS, AttemptProgress, decide_report),
        (TopicName.COMPLETIONS, Arrival, admit),
        (TopicName.CHECKPOINTS, Arrival, admit),
        (TopicName.EVENTS, Arrival, admit),
    ],
)
def test_each_kind_of_message_is_decided_by_its_model_function(
    topic: TopicName, kind: type[object], decide: object
) -> None:
    entry = INPUTS[topic].entries[kind]
    assert isinstance(entry, RunInput)
    assert entry.decide is decide
    assert entry.refused is (counted if kind is AttemptProgress else to_rejected)


def test_a_worker_announcement_is_fleet_news_heard_by_the_fleet() -> None:
    announcement = _announcement()
    decoded = INPUTS[TopicName.RESULTS].decode(
        _record(TopicName.RESULTS, encode(announcement)), KEYS
    )
    assert decoded == announcement
    entry = INPUTS[TopicName.RESULTS].entry(decoded, None)
    assert isinstance(entry, FleetNews)
    fleet = Fleet(announce_interval_ms=1_000)
    entry.hear(fleet, decoded)
    assert fleet.workers == {"w1": frozenset({("fx", 1)})}


def test_a_command_decodes_to_its_type_and_names_its_pipeline_when_it_starts_a_run() -> None:
    command = new_submit("fx", {"x": 1})
    decoded = INPUTS[TopicName.COMMANDS].decode(_record(TopicName.COMMANDS, encode(command)), KEYS)
    assert decoded == command
    entry = _entry(TopicName.COMMANDS, decoded)
    assert entry.run_id(decoded) == command.run_id
    assert entry.pipeline is not None and entry.pipeline(decoded) == "fx"
    cancel = CancelRun(command_id="c", run_id=command.run_id, requested_ms=1)
    assert _entry(TopicName.COMMANDS, cancel).pipeline is None


@pytest.mark.parametrize(
    ("topic", "carries", "stray"),
    [
        (TopicName.COMMANDS, "a command", _announcement()),
        (TopicName.RESULTS, "a result", CancelRun(command_id="c", run_id="r", requested_ms=1)),
    ],
)
def test_a_kind_the_topic_does_not_carry_is_the_wrong_schema(
    topic: TopicName, carries: str, stray: WorkerAnnouncement | CancelRun
) -> None:
    value = encode(stray)
    source = INPUTS[topic]
    decoded = source.decode(_record(topic, value), KEYS)
    with pytest.raises(FactDecodeError) as raised:
        source.entry(decoded, value)
    assert raised.value.reason == "wrong_schema"
    assert raised.value.detail == f"expected {carries} on {topic.value}, got {type(stray).__name__}"
    assert raised.value.raw == value


def test_a_completion_with_a_forged_token_decodes_to_a_refusal() -> None:
    forged = BoundaryCompletion(token="not-a-token", idempotency_key="k", outcome="success")
    record = _record(TopicName.COMPLETIONS, encode(forged))
    refusal = INPUTS[TopicName.COMPLETIONS].decode(record, KEYS)
    assert isinstance(refusal, Refusal)
    assert refusal.reason == "invalid_token"


def test_an_undecodable_record_raises_with_its_bytes() -> None:
    for topic in RUN_ADDRESSED_INPUTS:
        with pytest.raises(FactDecodeError) as raised:
            INPUTS[topic].decode(_record(topic, b"garbage"), KEYS)
        assert raised.value.raw == b"garbage"


def test_a_refused_claim_is_counted_not_rejected_and_still_answered() -> None:
    run = Run("fx")
    run.report(worker="w1/a", claim=True)
    claim = _claim(run, "w2/b")
    entry = _entry(TopicName.RESULTS, claim)
    assert entry.decide(claim, run.state, run.ctx).refusal == "attempt_claimed"
    before = _refused_progress("attempt_claimed")
    decision = entry.decided(claim, run.state, run.ctx)
    assert (decision.refusal, decision.facts) == (None, ())
    (answer,) = decision.emits
    assert isinstance(answer.value, ClaimReply) and not answer.value.granted
    assert _refused_progress("attempt_claimed") == before + 1


def test_a_refused_progress_report_is_counted_and_leaves_nothing() -> None:
    run = Run("hb")
    late = _progress(run, "w", claim=False).model_copy(update={"attempt": 99})
    entry = _entry(TopicName.RESULTS, late)
    refusal = entry.decide(late, run.state, run.ctx).refusal
    assert refusal is not None
    before = _refused_progress(refusal)
    assert entry.decided(late, run.state, run.ctx) == Decision()
    assert _refused_progress(refusal) == before + 1


def test_a_refused_command_keeps_its_refusal_for_admission_rejected() -> None:
    run = Run("fx")
    cancel = CancelRun(command_id="c", run_id="no-such-run", requested_ms=1)
    entry = _entry(TopicName.COMMANDS, cancel)
    decision = entry.decided(cancel, None, run.ctx)
    assert decision.refusal is not None
    assert decision == entry.decide(cancel, None, run.ctx)


def test_a_report_is_decided_as_a_claim_only_when_it_claims() -> None:
    run = Run("fx")
    claimed = decide_report(_claim(run, "w1/a"), run.state, run.ctx)
    assert any(isinstance(emit.value, ClaimReply) for emit in claimed.emits)
    started = decide_report(_progress(run, "w1/a", claim=False), run.state, run.ctx)
    assert not any(isinstance(emit.value, ClaimReply) for emit in started.emits)


def _progress(run: Run, worker: str, *, claim: bool) -> AttemptProgress:
    item = run.work[-1]
    return AttemptProgress(
        run_id=run.run_id,
        kind=item.kind,
        segment=item.segment,
        attempt=item.attempt,
        generation=item.generation,
        step=item.first_step,
        report="started",
        worker_id=worker,
        at_ms=run.now,
        claim=claim,
    )


def _claim(run: Run, worker: str) -> AttemptProgress:
    return _progress(run, worker, claim=True)
