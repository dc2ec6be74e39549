"""The wait registry: one wait per phase, and it behaves as the phase checks it replaced.

The references below (``_old_*``) are the phase comparisons the due index, the fold's
fencing, the stop and the status made before the registry (main at 9cf803e), kept
here to prove the registry changed nothing on every phase of representative runs.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, get_args

import pytest
from hypothesis import given, settings

from processor.clients.client import status_dict
from processor.facts.models import FactHeader, RunStopRequested
from processor.model import event_waits, waits
from processor.model import reduce as reduce_module
from processor.model.decide import TIMER_DECISIONS
from processor.model.due import DueEntry, due_entries
from processor.model.reduce import fold, reduce
from processor.model.state import COMPENSATE, FORWARD, Phase, RunState, Sleep
from processor.model.timers import ATTEMPT_TIMERS, TimerKind
from tests.unit.test_import_rules import _copy_of_package, _lint_imports
from tests.unit.test_native_fold import _every_fact_type
from tests.unit.test_reduce_laws import Event, events, simulate

PHASES: tuple[Phase, ...] = get_args(Phase)
ROOT = Path(__file__).resolve().parents[2]


def _prefix_states(facts: list[FactHeader]) -> list[RunState]:
    """The state of each run after each of its facts."""
    states: dict[str, RunState] = {}
    seen: list[RunState] = []
    for fact in facts:
        state = reduce(states.get(fact.run_id), fact)
        if state is not None:
            states[fact.run_id] = state
            seen.append(state)
    return seen


#: Runs that between them pass through every phase (the compiled fold's test runs).
FOLDED = _prefix_states(_every_fact_type())


# --- the references: the phase comparisons before the registry ------------------------------

_OLD_ATTEMPT_PHASES = {
    "dispatched": FORWARD,
    "retry_wait": FORWARD,
    "compensating": COMPENSATE,
    "compensation_retry_wait": COMPENSATE,
}
_OLD_FENCED = ("retry_wait", "suspended", "sleeping", "definition_blocked")
_OLD_HOLDS_STOP = ("dispatched", "unknown")


def _old_due_entries(state: RunState | None) -> frozenset[DueEntry]:
    if state is None or state.terminal:
        return frozenset()
    deadline: frozenset[DueEntry] = frozenset()
    if state.deadline_ms is not None and state.stop.reason is None:
        deadline = frozenset({DueEntry(state.deadline_ms, state.run_id, "run_deadline")})
    return deadline | _old_phase_entries(state)


def _old_phase_entries(state: RunState) -> frozenset[DueEntry]:
    run_id = state.run_id
    kind = _OLD_ATTEMPT_PHASES.get(state.phase)
    if kind is not None:
        attempt = state.attempt_of(kind)
        timeout, retry = ATTEMPT_TIMERS[kind]
        if attempt.running:
            scope, ordinal = attempt.scope, attempt.generation
            entries = set()
            if attempt.expires_ms is not None:
                started = attempt.started_step is not None
                timer: TimerKind = timeout if started else "schedule_to_start_timeout"
                entries.add(DueEntry(attempt.expires_ms, run_id, timer, scope, ordinal))
            if attempt.heartbeat_due_ms is not None:
                entries.add(
                    DueEntry(attempt.heartbeat_due_ms, run_id, "heartbeat_timeout", scope, ordinal)
                )
            return frozenset(entries)
        if attempt.waiting and attempt.retry_due_ms is not None:
            entry = DueEntry(attempt.retry_due_ms, run_id, retry, attempt.scope, attempt.generation)
            return frozenset({entry})
        return frozenset()
    # A chain whose child step failed: its stop waits for the other children's outcomes.
    held = state.phase == "idle" and state.stopping and not state.graph
    if state.phase == "suspended" or (held and waits.children_open(state)):
        return frozenset(
            DueEntry(i.deadline_ms, run_id, "interaction_timeout", i.boundary, i.item_index)
            for i in state.boundary_interactions()
            if i.status == "open" and i.deadline_ms > 0
        )
    if state.phase == "sleeping" and state.sleep.wake_ms is not None:
        entry = DueEntry(
            state.sleep.wake_ms, run_id, "sleep", state.attempt.segment, state.sleep.step or 0
        )
        return frozenset({entry})
    if state.phase == "publishing" and state.publication.due_ms is not None:
        return frozenset({DueEntry(state.publication.due_ms, run_id, "publication")})
    return frozenset()


def _old_status_views(state: RunState) -> dict[str, Any]:
    waiting = None
    if state.phase == "suspended":
        interactions = state.boundary_interactions()
        waiting = {
            "boundary": state.boundary.number,
            "kind": state.boundary.kind,
            "itemized": state.boundary.itemized,
            "items": state.boundary.items,
            "open": sum(i.status == "open" for i in interactions),
            "admitted": sum(i.status == "admitted" for i in interactions),
            "timed_out": sum(i.status == "timed_out" for i in interactions),
            "next_deadline_ms": min(
                (i.deadline_ms for i in interactions if i.status == "open"), default=None
            ),
            **event_waits.shown(interactions),  # new with event waits: none before
        }
    sleeping = None
    if state.phase == "sleeping":
        sleeping = {"step": state.sleep.step, "wake_ms": state.sleep.wake_ms}
    blocked = None
    if state.phase == "definition_blocked" and not state.terminal:
        blocked = {
            "pipeline": state.pipeline,
            "version": state.pipeline_version,
            "attempt": state.attempt.number,
            "next_step": state.attempt.next_step,
            "waiting_for": f"a live worker that loads {state.pipeline} v{state.pipeline_version}",
        }
    return {"waiting": waiting, "sleeping": sleeping, "blocked": blocked}


def _in_every_phase(states: list[RunState]) -> list[RunState]:
    """Each state as it is, and as if it were in each other phase (odd mixes included:
    the registry must agree with the old checks whatever the other fields hold)."""
    return [state.model_copy(update={"phase": phase}) for state in states for phase in PHASES]


# --- the registry ---------------------------------------------------------------------------


def test_every_phase_has_its_wait() -> None:
    assert set(waits.WAITS) == set(PHASES)
    assert all(phase == wait.phase for phase, wait in waits.WAITS.items())
    assert len({id(wait) for wait in waits.WAITS.values()}) == len(PHASES)


def test_the_folded_runs_pass_through_every_phase() -> None:
    """So the comparisons below see each wait on a state the fold really reaches."""
    assert {state.phase for state in FOLDED} == set(PHASES)


def test_every_timer_a_wait_arms_has_a_decision() -> None:
    armed = {kind for wait in waits.WAITS.values() for kind in wait.timers}
    assert armed | {"run_deadline"} == set(TIMER_DECISIONS) == set(get_args(TimerKind))


def test_a_wait_arms_only_the_timers_it_declares() -> None:
    for state in _in_every_phase(FOLDED):
        wait = waits.of(state)
        assert {entry.kind for entry in wait.arms(state)} <= wait.timers, state.phase


def test_the_attempt_of_a_wait_is_the_one_that_runs_or_retries_in_its_phase() -> None:
    """``state.attempt_of`` (below the registry) and ``runs``/``retries`` agree."""
    for state in _in_every_phase(FOLDED):
        wait = waits.of(state)
        for kind in (FORWARD, COMPENSATE):
            attempt = state.attempt_of(kind)
            assert not attempt.running or wait.runs == kind
            assert attempt.waiting == (wait.retries == kind)


def test_the_stop_declarations_are_the_old_phase_checks() -> None:
    fenced = {wait.phase for wait in waits.WAITS.values() if wait.fenced}
    holding = {wait.phase for wait in waits.WAITS.values() if wait.holds_stop}
    past_stopping = {wait.phase for wait in waits.WAITS.values() if not wait.stoppable}
    assert fenced == set(_OLD_FENCED)
    assert holding == set(_OLD_HOLDS_STOP)
    assert past_stopping == {"publishing"}
    assert {wait.phase for wait in waits.WAITS.values() if wait.runs == FORWARD} == {"dispatched"}


# --- the same behaviour -----------------------------------------------------------------------


def test_due_entries_equal_the_old_ones_on_folded_runs() -> None:
    for state in FOLDED:
        assert due_entries(state) == _old_due_entries(state), state.phase


def test_due_entries_equal_the_old_ones_in_every_phase() -> None:
    for state in _in_every_phase(FOLDED):
        assert due_entries(state) == _old_due_entries(state), state.phase


@given(events)
@settings(max_examples=60, deadline=None)
def test_due_entries_equal_the_old_ones_on_simulated_runs(script: list[Event]) -> None:
    sim = simulate(script)
    for state in _prefix_states(sim.facts):
        assert due_entries(state) == _old_due_entries(state)


@pytest.mark.parametrize("reason", ["cancelled", "timed_out", "failed"])
def test_stop_intent_fences_the_same_waits(reason: str) -> None:
    for before in _in_every_phase([s for s in FOLDED if not s.terminal]):
        stop = RunStopRequested(
            run_id=before.run_id,
            seq=before.version + 1,
            fact_key=f"stop/{before.phase}",
            time_ms=before.updated_ms + 1,
            cause_id="test",
            reason=reason,
            detail="d",
        )
        after = reduce(before, stop)
        assert after is not None
        # ...but for a child boundary with a child open: the stop waits for it now.
        held = before.phase == "suspended" and waits.children_open(before)
        fenced = before.phase in _OLD_FENCED and not held
        assert after.phase == ("idle" if fenced else before.phase)
        attempt = reduce_module._no_retry(before)
        if before.phase == "retry_wait":
            reasons = reduce_module._FENCED_RETRY_REASONS
            attempt = reduce_module._with_reason(attempt, reasons.get(reason))
        assert after.attempt == attempt
        assert after.sleep == (Sleep() if before.phase == "sleeping" else before.sleep)
        assert due_entries(after) == _old_due_entries(after)


def test_status_shows_each_wait_as_before() -> None:
    for state in _in_every_phase(FOLDED):
        assert waits.status_views(state) == _old_status_views(state), state.phase
    terminal = [s for s in _in_every_phase(FOLDED) if s.terminal]
    assert terminal, "the folded runs end terminal too"


def test_a_folded_run_shows_its_wait_in_status() -> None:
    facts = _every_fact_type()
    for run_id in {fact.run_id for fact in facts}:
        state = fold([fact for fact in facts if fact.run_id == run_id])
        assert state is not None
        shown = status_dict(state)
        assert {key: shown[key] for key in ("waiting", "sleeping", "blocked")} == (
            _old_status_views(state)
        )


# --- nothing outside the registry compares phases ----------------------------------------------

#: Phase comparisons that stay, by module, with why.
ALLOWED = {
    # ``state.py`` defines ``Phase`` and ``RunState`` below the registry (``waits`` reads
    # ``RunState``, so ``state`` cannot read ``waits``): ``attempt_of`` says in which
    # phase each kind of attempt runs and waits for its retry; the registry's
    # ``runs``/``retries`` agree with it (tested above).
    "processor/model/state.py": 4,
}


def _phase_comparisons(path: Path) -> int:
    """Comparisons (==, !=, in, not in) with a ``.phase`` attribute or a ``phase`` name."""

    def names_phase(node: ast.expr) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "phase") or (
            isinstance(node, ast.Name) and node.id == "phase"
        )

    found = 0
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Compare):
            continue
        if not all(isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn) for op in node.ops):
            continue
        found += any(names_phase(operand) for operand in (node.left, *node.comparators))
    return found


def test_no_module_outside_the_registry_compares_phases() -> None:
    counts = {
        str(path.relative_to(ROOT)): _phase_comparisons(path)
        for path in sorted((ROOT / "processor").rglob("*.py"))
        if path.name != "waits.py" or path.parent.name != "model"
    }
    assert {path: n for path, n in counts.items() if n} == ALLOWED


def test_the_check_would_notice_a_phase_comparison(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        'def f(state, phase):\n    return state.phase == "sleeping" or phase in ("idle",)\n'
    )
    assert _phase_comparisons(module) == 2


def test_the_registry_may_not_import_the_fold_or_a_decision(tmp_path: Path) -> None:
    tree = _copy_of_package(tmp_path)
    target = tree / "processor" / "model" / "waits.py"
    target.write_text(target.read_text() + "\nimport processor.model.sleeps\n")
    result = _lint_imports(tree)
    assert result.returncode != 0
    assert "Waits: the registry sits below the fold and the decisions" in result.stdout
    assert "BROKEN" in result.stdout
