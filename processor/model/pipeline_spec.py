"""What the pure model needs to know of a pipeline: its steps and their policies.

The worker layer builds these from user code (``processor.worker.pipeline``); the
model never sees user functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from processor.facts.json_wire import Wire
from processor.model.graph import Graph, Tolerance

__all__ = [
    "AwaitSpec",
    "CheckpointSpec",
    "CompensationSpec",
    "PipelineSpec",
    "RetryPolicy",
    "SleepSpec",
    "StepSpec",
]

OnTimeout = Literal["fail", "continue"]
AwaitKind = Literal["await", "checkpoint", "child", "event"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with a cap; deterministic (no jitter) so replays agree."""

    max_attempts: int = 3
    initial_backoff_ms: int = 100
    multiplier: float = 2.0
    max_backoff_ms: int = 10_000

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.initial_backoff_ms < 0 or self.max_backoff_ms < 0 or self.multiplier < 1:
            raise ValueError("backoff must be non-negative and multiplier at least 1")

    def allows_another(self, attempts_made: int) -> bool:
        return attempts_made < self.max_attempts

    def backoff_ms(self, attempts_made: int) -> int:
        """Delay before attempt ``attempts_made + 1``."""
        raw = self.initial_backoff_ms * self.multiplier ** max(attempts_made - 1, 0)
        return int(min(raw, self.max_backoff_ms))


@dataclass(frozen=True, slots=True)
class AwaitSpec:
    """A boundary: the run suspends until outside input arrives or the timeout passes.

    ``kind="await"``: one request per interaction goes to ``target`` on
    boundary.requests; ``kind="checkpoint"``: the run waits for a checkpoint
    handoff named ``target`` from another pipeline. ``wire`` encodes the
    requests: Avro (the default) or the JSON shape of ``processor.facts.json_wire``,
    for systems without Avro.
    """

    target: str
    timeout_ms: int
    itemized: bool = False
    on_timeout: OnTimeout = "fail"
    kind: AwaitKind = "await"
    wire: Wire = "avro"
    # An itemized await's items sent at once (None: all), and the failed items it
    # tolerates (None: the first failure fails the step).
    max_in_flight: int | None = None
    tolerance: Tolerance | None = None
    # An event wait's correlation field keying it in the correlation index (event_waits.py).
    event_key: str | None = None


@dataclass(frozen=True, slots=True)
class SleepSpec:
    """A sleep step: the run waits on a durable timer, then the next step gets the
    sleep step's input.

    ``duration_ms``: sleep that long from when the run reaches the step; None: the
    step's function computes the wake time from the previous output (``sleep_until``).
    """

    duration_ms: int | None = None


@dataclass(frozen=True, slots=True)
class CheckpointSpec:
    """Publish the run's output as a named checkpoint for ``target``.

    ``target`` is ``pipeline:<name>`` (start a run of it) or ``run:<id>``.
    """

    name: str
    target: str


@dataclass(frozen=True, slots=True)
class CompensationSpec:
    """A step's compensator: undoes the step's effect during an unwind."""

    retry: RetryPolicy = RetryPolicy()
    timeout_ms: int = 30_000


@dataclass(frozen=True, slots=True)
class StepSpec:
    """A step. ``effectful`` steps whose attempt is lost become Unknown, never retried blindly."""

    name: str
    retry: RetryPolicy = RetryPolicy()
    timeout_ms: int = 30_000
    awaits: AwaitSpec | None = None
    effectful: bool = False
    sleeps: SleepSpec | None = None  # a sleep step (it ends its segment, as an await does)
    compensation: CompensationSpec | None = None
    # A started step that sends no heartbeat for this long is lost (None: no heartbeats).
    heartbeat_timeout_ms: int | None = None
    # How long a dispatched attempt may wait for a worker to start it (None: unbounded).
    schedule_to_start_timeout_ms: int | None = None


@dataclass(frozen=True, slots=True)
class PipelineSpec:
    name: str
    version: int
    steps: tuple[StepSpec, ...]
    output_topic: str | None = None
    checkpoint: CheckpointSpec | None = None
    deadline_ms: int | None = None  # relative run deadline applied at submit
    # The steps as a graph (``model/graph.py``), when any step declares needs, a rule,
    # routes, a catch handler or is a finally step; None: a chain, run as a list.
    graph: Graph | None = None
    # Topics its steps may emit events to (``model/emission.py``), besides the settings'.
    emit_topics: tuple[str, ...] = ()

    @property
    def last_step(self) -> int:
        return len(self.steps) - 1

    @property
    def compensates(self) -> bool:
        """Whether any step declares a compensator (else failures need no unwind)."""
        return any(step.compensation is not None for step in self.steps)

    def segment_effectful(self, first_step: int) -> bool:
        """Whether an attempt starting at ``first_step`` may run an effectful step."""
        return any(s.effectful for s in self.steps[first_step : self.segment_end(first_step) + 1])

    def needs_claim(self, kind: str, first_step: int) -> bool:
        """Whether an attempt (``kind`` forward or compensate) starting at ``first_step``
        runs only once claimed (``model.claims``): it may run an effectful step, or it is
        the compensator of one; neither may run twice."""
        if kind == "compensate":
            return self.steps[first_step].effectful
        return self.segment_effectful(first_step)

    def segment_end(self, first_step: int) -> int:
        """The last step a segment starting at ``first_step`` runs: its await or sleep
        step, or the end (in a graph, every step is a segment of its own)."""
        if self.graph is not None:
            return first_step
        for index in range(first_step, len(self.steps)):
            step = self.steps[index]
            if step.awaits is not None or step.sleeps is not None:
                return index
        return self.last_step

    def outlives_deadline(self, step: int) -> bool:
        """Whether ``step`` runs after the run deadline too: a graph's finally step."""
        return self.graph is not None and self.graph.nodes[step].is_finally

    def step_index(self, name: str) -> int:
        """The index of the step named ``name``."""
        for index, step in enumerate(self.steps):
            if step.name == name:
                return index
        raise KeyError(name)

    def segment_timeout_ms(self, first_step: int) -> int:
        """An attempt runs its segment's steps, so it may take their summed timeouts."""
        end = self.segment_end(first_step)
        return sum(step.timeout_ms for step in self.steps[first_step : end + 1])

    def started_timeout_ms(self, step: int) -> int:
        """How long after a worker reports ``step`` started its attempt may go without a
        result: an effectful step's own timeout (then its outcome is unknown), else the
        summed timeouts of it and the later steps of its segment (reported or not)."""
        if self.steps[step].effectful:
            return self.steps[step].timeout_ms
        return self.segment_timeout_ms(step)
