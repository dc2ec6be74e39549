"""The pure part of quarantine: the fact, the run's mark, its timers, its index row,
the refusal of later inputs and the release (``processor/model/quarantine.py``)."""

from __future__ import annotations

from processor.facts.models import CommandReply, ReleaseRun, RunQuarantined, RunReleased
from processor.model.due import due_entries
from processor.model.listing import IndexEntry, index_entries
from processor.model.quarantine import MAX_ERROR, QUARANTINED, decide_quarantine, refused
from processor.model.quarantine import decide_release as release
from processor.model.reduce import fold
from tests.unit.test_progress import Run


def _release(run: Run, command_id: str = "c-1") -> ReleaseRun:
    return ReleaseRun(command_id=command_id, run_id=run.run_id, requested_ms=run.now)


def _started_run() -> Run:
    run = Run("hb")
    run.report()  # started: its timeout and heartbeat timers are armed
    assert due_entries(run.state)
    return run


def test_a_quarantine_records_the_capped_exception_and_stops_the_timers() -> None:
    run = _started_run()
    before = run.state
    decision = run.take(decide_quarantine(before, "timer:heartbeat_timeout", "E", "x" * 5000, 7))
    (fact,) = decision.facts
    assert isinstance(fact, RunQuarantined) and len(fact.error) == MAX_ERROR
    assert fact.fact_key == f"quarantined/{before.version + 1}"
    state = run.state
    assert state.quarantine is not None and state.quarantine.seq == fact.seq
    assert (state.phase, state.attempt) == (before.phase, before.attempt)  # kept as it was
    assert due_entries(state) == frozenset()
    row = IndexEntry("quarantined", (), state.submitted_ms, state.run_id)
    assert row in index_entries(state) and row not in index_entries(before)
    # Folding it again changes nothing; a second exception adds no fact.
    assert fold([*run.facts, fact]) == state
    assert decide_quarantine(state, "wake", "F", "y", 8).facts == ()


def test_inputs_are_refused_with_a_reply_to_a_command() -> None:
    run = _started_run()
    run.take(decide_quarantine(run.state, "segments.results", "E", "boom", 7))
    assert refused(run.state, None).refusal == QUARANTINED
    answer = refused(run.state, "cmd-9")
    (reply,) = answer.emits
    assert isinstance(reply.value, CommandReply) and reply.value.refusal == QUARANTINED


def test_a_release_arms_the_timers_again_and_a_second_one_is_refused() -> None:
    run = _started_run()
    armed = due_entries(run.state)
    run.take(decide_quarantine(run.state, "timer:attempt_timeout", "E", "boom", 7))
    quarantined_seq = run.state.version
    decision = run.take(release(_release(run), run.state, run.ctx))
    (fact,) = decision.facts
    assert isinstance(fact, RunReleased) and fact.quarantined_seq == quarantined_seq
    assert run.state.quarantine is None and due_entries(run.state) == armed
    again = release(_release(run, "c-2"), run.state, run.ctx)
    assert again.refusal == "not_quarantined" and again.facts == ()
    assert release(_release(run), None, run.ctx).refusal == "unknown_run"


def test_a_run_quarantined_again_after_a_release_gets_a_new_fact() -> None:
    run = _started_run()
    run.take(decide_quarantine(run.state, "wake", "E", "one", 7))
    run.take(release(_release(run), run.state, run.ctx))
    second = run.take(decide_quarantine(run.state, "wake", "E", "two", 9)).facts
    assert len(second) == 1 and run.state.quarantine is not None
    assert run.state.quarantine.error == "two"
