"""The vocabulary of decisions: context in, facts and messages out.

``FactMaker`` stamps facts for one run (sequence numbers, time, cause) and folds
them as it goes, so each transition sees the facts added before it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypedDict

from processor.facts import keys
from processor.facts.json_wire import Wire
from processor.facts.keyring import KeyRing
from processor.facts.models import AvroModel, CommandReply, FactHeader, RunOutcome
from processor.facts.topics import TopicName
from processor.model.due import DueEntry
from processor.model.parent_link import parent_completion
from processor.model.pipeline_spec import PipelineSpec
from processor.model.reduce import reduce
from processor.model.state import RunState

__all__ = [
    "Context",
    "Decision",
    "Emit",
    "FactMaker",
    "Header",
    "LiveVersions",
    "PipelineCatalog",
    "Publish",
    "Reply",
    "TimerFired",
    "refuse",
    "replier",
]


# The default of decisions that sign nothing (pure tests): one empty key, as before rings.
_UNCONFIGURED_KEYS = KeyRing.single(b"")


class PipelineCatalog(Protocol):
    """The pipelines the processor knows, by name and version."""

    def latest(self, name: str) -> PipelineSpec | None: ...

    def get(self, name: str, version: int) -> PipelineSpec | None: ...


#: The (pipeline, version) pairs that live workers announce they load.
LiveVersions = frozenset[tuple[str, int]]


@dataclass(frozen=True, slots=True)
class Context:
    """What every decision may depend on besides the run: pipelines, time, resume keys."""

    catalog: PipelineCatalog
    now: int
    # Signs resume tokens and checkpoint handoffs; the loop passes the configured ring.
    resume_keys: KeyRing = _UNCONFIGURED_KEYS
    # The largest run input or completion payload admitted (the loop passes the
    # configured one); None: no limit.
    max_payload_bytes: int | None = None
    # Attempts a run may lose to the infrastructure before a loss counts as a failure
    # (``processor.model.progress``); the loop passes the configured bound.
    max_infrastructure_losses: int = 20
    # What live workers load (the processor's catalog of workers, engine/fleet.py); None:
    # not known (no announcement heard, or still warming up), every version counts as
    # loaded. A forward attempt of a version no live worker loads is not dispatched: the
    # run waits in phase ``definition_blocked``.
    live_versions: LiveVersions | None = None
    # Topics any pipeline's steps may emit to (``PROCESSOR_EMIT_TOPICS``; model/emission.py).
    emit_topics: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class TimerFired:
    """A due-work row whose time has come."""

    entry: DueEntry

    @property
    def cause_id(self) -> str:
        e = self.entry
        return f"timer/{e.kind}/{e.run_id}/{e.scope}/{e.ordinal}"


@dataclass(frozen=True, slots=True)
class Emit:
    """A message to produce in the same transaction as the facts."""

    topic: TopicName
    key: str
    value: AvroModel
    wire: Wire = "avro"  # "json": the JSON shape of processor.facts.json_wire


@dataclass(frozen=True, slots=True)
class Publish:
    """An external effect performed and confirmed *before* the decision commits.

    Terminal publication: a crash after it and before the commit publishes again
    with the same idempotency key.
    """

    topic: str | TopicName
    key: str
    value: bytes
    headers: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True)
class Folded:
    """A run before a decision's facts (None: a new run) and after them."""

    base: RunState | None
    after: RunState


@dataclass(frozen=True, slots=True)
class Decision:
    """What one input did: facts to append against ``expected_version``, messages to send."""

    expected_version: int = 0
    facts: tuple[FactHeader, ...] = ()
    emits: tuple[Emit, ...] = ()
    refusal: str | None = None
    detail: str = ""
    effects: tuple[Publish, ...] = ()
    #: The run it was decided on and the run with ``facts`` folded in, as its maker
    #: folded them (None: not known). A staging that appends every fact unchanged to
    #: that very run takes the folded one rather than folding them again.
    folded: Folded | None = field(default=None, compare=False, repr=False)

    @staticmethod
    def refuse(reason: str, detail: str, *emits: Emit) -> Decision:
        return Decision(refusal=reason, detail=detail, emits=emits)


class Header(TypedDict):
    """The fields every fact begins with (``FactHeader``), as ``FactMaker.header`` gives them."""

    run_id: str
    seq: int
    fact_key: str
    time_ms: int
    cause_id: str


@dataclass
class FactMaker:
    """Stamps facts with the run id, the next sequence numbers, time and cause.

    It also folds them, so later decisions in the same input see earlier ones.
    """

    state: RunState | None
    run_id: str
    now: int
    cause_id: str
    facts: list[FactHeader] = field(default_factory=list)
    emits: list[Emit] = field(default_factory=list)
    effects: list[Publish] = field(default_factory=list)
    live: LiveVersions | None = None  # ``Context.live_versions``
    #: A graph run's lane the input is about (``current`` is then that lane's view).
    lane: int | None = None
    _folded: RunState | None = None

    def __post_init__(self) -> None:
        self._folded = self.state

    @property
    def base_version(self) -> int:
        return self.state.version if self.state is not None else 0

    def loads(self, spec: PipelineSpec) -> bool:
        """Whether a live worker loads ``spec``'s version (True when not known)."""
        return self.live is None or (spec.name, spec.version) in self.live

    @property
    def current(self) -> RunState:
        """The run with every fact added so far folded in, as ``lane`` sees it."""
        assert self._folded is not None, "facts before RunSubmitted"
        if self.lane is None:
            return self._folded
        return self._folded.lane_view(self.lane)

    @property
    def run(self) -> RunState:
        """The whole run with every fact added so far folded in, whatever the lane."""
        assert self._folded is not None, "facts before RunSubmitted"
        return self._folded

    def header(self, fact_key: str) -> Header:
        """The header of the next fact, named ``fact_key``: build it with typed fields,
        ``Fact(**maker.header(key), field=...)``, and ``add`` it at once.

        After a redrive the key is scoped by the run's redrive count (``keys.in_redrive``)."""
        folded = self._folded
        if folded is not None and folded.redrives:
            fact_key = keys.in_redrive(len(folded.redrives), fact_key)
        return {
            "run_id": self.run_id,
            "seq": self.base_version + len(self.facts) + 1,
            "fact_key": fact_key,
            "time_ms": self.now,
            "cause_id": self.cause_id,
        }

    def add(self, fact: FactHeader) -> None:
        """Append ``fact`` (its header from ``header``) and fold it into ``current``."""
        assert fact.seq == self.base_version + len(self.facts) + 1, "a header used twice"
        self.facts.append(fact)
        self._folded = reduce(self._folded, fact)

    def emit(self, topic: TopicName, value: AvroModel, wire: Wire = "avro") -> None:
        self.emits.append(Emit(topic, self.run_id, value, wire))

    def emit_outcome(
        self, status: str, *, result: bytes | None = None, error: str | None = None
    ) -> None:
        """The run's terminal outcome on runs.results."""
        state = self.current
        outcome = RunOutcome(
            run_id=state.run_id,
            pipeline=state.pipeline,
            status=status,
            result=result,
            error=error,
            submitted_ms=state.submitted_ms,
            finished_ms=self.now,
        )
        self.emit(TopicName.OUTCOMES, outcome)
        if state.parent is not None:  # a child run: its outcome completes its parent's wait
            reported = parent_completion(state.run_id, state.parent, status, result, error)
            self.emits.append(Emit(TopicName.COMPLETIONS, state.parent.run_id, reported))

    def decision(self, refusal: str | None = None, detail: str = "") -> Decision:
        return Decision(
            self.base_version,
            tuple(self.facts),
            tuple(self.emits),
            refusal,
            detail,
            tuple(self.effects),
            self._folded_by_facts(),
        )

    def _folded_by_facts(self) -> Folded | None:
        if not self.facts or self._folded is None:
            return None
        return Folded(self.state, self._folded)


Reply = Callable[..., Emit]


def replier(command_id: str, run_id: str) -> Reply:
    def reply(
        created: bool,
        refusal: str | None = None,
        detail: str | None = None,
        response: str | None = None,
    ) -> Emit:
        value = CommandReply(
            command_id=command_id,
            run_id=run_id,
            created=created,
            refusal=refusal,
            detail=detail,
            response=response,
        )
        return Emit(TopicName.REPLIES, run_id, value)

    return reply


def refuse(reply: Reply, reason: str, detail: str) -> Decision:
    return Decision.refuse(reason, detail, reply(False, reason, detail))
