"""A pure simulation of runs through decide/reduce, for property tests.

Hypothesis draws a script of events (submits, worker results, timers firing);
the simulation feeds them to the real decide functions and folds the facts with
the real reducer, exactly as the loop does, but with no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from processor.clients.client import new_submit
from processor.facts.keyring import KeyRing
from processor.facts.models import AttemptProgress, FactHeader, SegmentResult, StepOutput
from processor.model.decide import (
    Context,
    Decision,
    TimerFired,
    decide_progress,
    decide_result,
    decide_submit,
    decide_timer,
)
from processor.model.due import due_entries
from processor.model.pipeline_spec import PipelineSpec, RetryPolicy, StepSpec
from processor.model.reduce import reduce
from processor.model.state import RunState

SPEC = PipelineSpec(
    "sim",
    1,
    (
        StepSpec("a", RetryPolicy(max_attempts=3, initial_backoff_ms=10), timeout_ms=1_000),
        StepSpec("b", RetryPolicy(max_attempts=2, initial_backoff_ms=5), timeout_ms=1_000),
        StepSpec("c", RetryPolicy(max_attempts=3, initial_backoff_ms=0), timeout_ms=500),
    ),
)


class Catalog:
    def latest(self, name: str) -> PipelineSpec | None:
        return SPEC if name == SPEC.name else None

    def get(self, name: str, version: int) -> PipelineSpec | None:
        return SPEC if (name, version) == (SPEC.name, SPEC.version) else None


CATALOG = Catalog()
SIMULATION_KEYS = KeyRing.single(b"simulation-secret")


@dataclass
class Simulation:
    now: int = 1_000
    states: dict[str, RunState] = field(default_factory=dict)
    facts: list[FactHeader] = field(default_factory=list)
    counter: int = 0
    keys: KeyRing = SIMULATION_KEYS
    #: Decisions whose own folded run (``Decision.folded``) was checked against the fold.
    folded_checked: int = 0

    @property
    def ctx(self) -> Context:
        return Context(CATALOG, self.now, self.keys)

    def _take(self, decision: Decision) -> Decision:
        for fact in decision.facts:
            self.facts.append(fact)
            state = reduce(self.states.get(fact.run_id), fact)
            assert state is not None
            self.states[fact.run_id] = state
        if decision.facts:  # the run its decider folded is the one the reducer folds
            assert decision.folded is not None
            assert decision.folded.after == self.states[decision.facts[0].run_id]
            self.folded_checked += 1
        return decision

    def submit(self, key: str | None = None, value: int = 0) -> str:
        command = new_submit("sim", {"v": value}, key, now_ms=self.now)
        self._take(decide_submit(command, self.states.get(command.run_id), self.ctx))
        return command.run_id

    def result(
        self, run_id: str, fail: bool, progress: int = 0, retryable: bool = True
    ) -> Decision:
        """The current attempt's result: all remaining steps, or ``progress`` then a failure."""
        state = self.states[run_id]
        self.counter += 1
        first, end = state.attempt.next_step, SPEC.last_step + 1
        done = min(progress, end - first - 1) if fail else end - first
        outputs = tuple(
            StepOutput(step=s, output=f'{{"s":{s},"n":{self.counter}}}'.encode())
            for s in range(first, first + done)
        )
        result = SegmentResult(
            result_id=f"r{self.counter}",
            run_id=run_id,
            segment=state.attempt.segment,
            attempt=state.attempt.number,
            generation=state.attempt.generation,
            steps=outputs,
            outcome="failed" if fail else "completed",
            failed_step=first + done if fail else None,
            error="boom" if fail else None,
            error_type="RuntimeError" if fail else None,
            retryable=retryable,
            worker_id="w",
        )
        return self._take(decide_result(result, state, self.ctx))

    def progress(
        self, run_id: str, report: str = "started", step: int | None = None, worker: str = "w"
    ) -> Decision:
        """A worker's report on the current attempt: ``step`` (default: its next) started,
        or a heartbeat."""
        state = self.states[run_id]
        message = AttemptProgress(
            run_id=run_id,
            segment=state.attempt.segment,
            attempt=state.attempt.number,
            generation=state.attempt.generation,
            step=state.attempt.next_step if step is None else step,
            report=report,  # type: ignore[arg-type]
            worker_id=worker,
            at_ms=self.now,
        )
        return self._take(decide_progress(message, state, self.ctx))

    def advance(self, ms: int) -> None:
        """Move the clock and fire every due timer, earliest first."""
        self.now += ms
        due = sorted(
            e for s in self.states.values() for e in due_entries(s) if e.due_ms <= self.now
        )
        for entry in due:
            state = self.states.get(entry.run_id)
            self._take(decide_timer(TimerFired(entry), state, self.ctx))
