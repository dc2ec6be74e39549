"""The processor's inputs: for each topic, how a record decodes and what decides on it.

One table, ``INPUTS``: for each run-addressed input topic, a decoder (the record's
bytes and headers to a typed message, or a ``Refusal``) and an entry per kind of
message the topic carries. An entry says how the loop treats that kind:

- ``RunInput``: a message about one run. The loop forwards it to the run's partition
  if it was produced to another, then decides on it against the run's staged state;
  the entry's ``refused`` policy says where a refused decision goes (by default to
  admission.rejected, with the original record).
- ``FleetNews``: a worker's announcement, on every partition of its topic; the loop
  hands it to its fleet of workers (``engine/fleet.py``), neither routed nor decided.

A kind that a topic does not list is refused as ``wrong_schema``. A new kind of input
is one entry here (and a new topic one more ``InputTopic``); the loop
(``engine/loop.py``) still orders every effect.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from processor.admission.admit import admit
from processor.admission.arrivals import (
    Arrival,
    Refusal,
    completion_arrival,
    handoff_arrival,
    record_cause,
)
from processor.admission.signals import KeyedEvent, event_arrival
from processor.engine.fleet import Fleet
from processor.errors import FactDecodeError
from processor.facts.codec import codec
from processor.facts.keyring import KeyRing
from processor.facts.models import (
    AttemptProgress,
    CancelRun,
    RedriveRun,
    ReleaseRun,
    ResolveAttempt,
    SegmentResult,
    SubmitRun,
    WorkerAnnouncement,
)
from processor.facts.topics import TopicName
from processor.model import quarantine
from processor.model.decide import (
    Context,
    Decision,
    decide_cancel,
    decide_claim,
    decide_progress,
    decide_redrive,
    decide_resolve,
    decide_result,
    decide_submit,
)
from processor.model.state import RunState
from processor.telemetry import metrics
from processor.transport.base import Record

__all__ = [
    "INPUTS",
    "ByKey",
    "Decoder",
    "FleetNews",
    "InputTopic",
    "RunInput",
    "counted",
    "decide_report",
    "to_rejected",
]

logger = logging.getLogger(__name__)


class RunAddressed(Protocol):
    """A message about one run."""

    @property
    def run_id(self) -> str: ...


M = TypeVar("M", bound=RunAddressed)
N = TypeVar("N")

#: A record to the typed message it carries, or a Refusal (raises FactDecodeError when
#: it cannot be decoded at all). The key ring verifies resume tokens and handoffs.
Decoder = Callable[[Record, KeyRing], object]
#: What a refused decision becomes before the loop applies it.
RefusalPolicy = Callable[[Decision], Decision]


def to_rejected(decision: Decision) -> Decision:
    """Keep the refusal: the loop sends the input to admission.rejected with its reason."""
    return decision


def counted(decision: Decision) -> Decision:
    """A refused progress report or claim (late or repeated: no error) is counted in a
    metric, never sent to admission.rejected; what answers it (a refused claim's
    reply) is still sent."""
    logger.debug("progress refused: %s %s", decision.refusal, decision.detail)
    metrics.PROGRESS_REFUSED.labels(decision.refusal).inc()
    return Decision(emits=decision.emits)


@dataclass(frozen=True, slots=True)
class RunInput(Generic[M]):
    """A message about one run: routed to the run's partition, decided against its state."""

    kind: type[M]
    decide: Callable[[M, RunState | None, Context], Decision]
    refused: RefusalPolicy = to_rejected
    # A message that may start a run: the pipeline a new run's log lines name.
    pipeline: Callable[[M], str] | None = None
    # Decided for a quarantined run too (the release); any other is refused.
    in_quarantine: bool = False

    def run_id(self, message: M) -> str:
        return message.run_id

    def decided(self, message: M, state: RunState | None, ctx: Context) -> Decision:
        """The decision on ``message``, a refusal as the entry's policy says."""
        if state is not None and state.quarantine is not None and not self.in_quarantine:
            decision = quarantine.refused(state, getattr(message, "command_id", None))
        else:
            decision = self.decide(message, state, ctx)
        return decision if decision.refusal is None else self.refused(decision)


@dataclass(frozen=True, slots=True)
class FleetNews(Generic[N]):
    """A message for the fleet of workers, sent on every partition: not routed, not
    decided, only heard."""

    kind: type[N]
    hear: Callable[[Fleet, N], None]


@dataclass(frozen=True, slots=True)
class ByKey:
    """An event by correlation key, for every run waiting on it whatever its partition:
    the loop decides it for the runs waiting on the key (found in the runs index) of
    each partition it owns, then forwards it to a partition it does not own
    (docs/design/signals.md)."""

    kind: type[KeyedEvent] = KeyedEvent


Entry = RunInput[Any] | FleetNews[Any] | ByKey


@dataclass(frozen=True, slots=True)
class InputTopic:
    """One input topic: how its records decode, and the entry of each kind it carries."""

    topic: TopicName
    carries: str  # what it carries, as a wrong_schema refusal names it ("a command")
    decode: Decoder
    entries: Mapping[type[object], Entry]

    @staticmethod
    def of(topic: TopicName, carries: str, decode: Decoder, *entries: Entry) -> InputTopic:
        return InputTopic(topic, carries, decode, {entry.kind: entry for entry in entries})

    def entry(self, message: object, value: bytes | None) -> Entry:
        """The entry of ``message``'s kind; a kind this topic does not carry is refused."""
        entry = self.entries.get(type(message))
        if entry is None:
            got = type(message).__name__
            detail = f"expected {self.carries} on {self.topic.value}, got {got}"
            raise FactDecodeError("wrong_schema", detail, value)
        return entry


def decide_report(report: AttemptProgress, state: RunState | None, ctx: Context) -> Decision:
    """A worker's progress report, or its claim of an attempt that must not run twice."""
    decide = decide_claim if report.claim else decide_progress
    return decide(report, state, ctx)


def _submitted_pipeline(command: SubmitRun) -> str:
    return command.pipeline


def _avro(record: Record, keys: KeyRing) -> object:
    return codec().decode(record.value)


def _completion(record: Record, keys: KeyRing) -> Arrival | Refusal:
    cause = record_cause(record.topic, record.partition, record.offset)
    return completion_arrival(record.value, keys, cause, record.headers)


def _event(record: Record, keys: KeyRing) -> Arrival | KeyedEvent | Refusal:
    cause = record_cause(record.topic, record.partition, record.offset)
    return event_arrival(record.value, cause, record.headers)


def _handoff(record: Record, keys: KeyRing) -> Arrival | Refusal:
    cause = record_cause(record.topic, record.partition, record.offset)
    return handoff_arrival(record.value, keys, cause)


INPUTS: Mapping[TopicName, InputTopic] = {
    source.topic: source
    for source in (
        InputTopic.of(
            TopicName.COMMANDS,
            "a command",
            _avro,
            RunInput(SubmitRun, decide_submit, pipeline=_submitted_pipeline),
            RunInput(CancelRun, decide_cancel),
            RunInput(ResolveAttempt, decide_resolve),
            RunInput(RedriveRun, decide_redrive),
            RunInput(ReleaseRun, quarantine.decide_release, in_quarantine=True),
        ),
        InputTopic.of(
            TopicName.RESULTS,
            "a result",
            _avro,
            RunInput(SegmentResult, decide_result),
            RunInput(AttemptProgress, decide_report, refused=counted),
            FleetNews(WorkerAnnouncement, Fleet.heard),
        ),
        InputTopic.of(TopicName.COMPLETIONS, "a completion", _completion, RunInput(Arrival, admit)),
        InputTopic.of(TopicName.CHECKPOINTS, "a handoff", _handoff, RunInput(Arrival, admit)),
        InputTopic.of(TopicName.EVENTS, "an event", _event, RunInput(Arrival, admit), ByKey()),
    )
}
