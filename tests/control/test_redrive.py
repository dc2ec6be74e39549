"""Redrive of a failed run through RedriveRun records on runs.commands, on both transports."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from processor.clients.client import status_dict
from processor.clients.outcome import terminal_result
from processor.facts.codec import codec
from processor.facts.models import (
    BoundaryCompletion,
    BoundaryRequest,
    FactHeader,
    RunFailed,
    RunOutcome,
    RunRedriven,
    RunSucceeded,
    SegmentAttemptStarted,
    StepCompleted,
    WorkItem,
)
from processor.facts.topics import TopicName
from processor.model.state import RunState
from processor.transport.base import Record
from tests.apps.control_pipelines import MEND_RETRY, expected_survey_result
from tests.apps.support import read_topic
from tests.control.control_support import Control


def failed_mend(ctl: Control, gate: Path) -> tuple[str, RunState]:
    """A mend run whose gate is closed: it fails at step 1 after its retry budget."""
    run_id = ctl.submit("mend", {"gate": str(gate)})
    state = ctl.play_timed(run_id, lambda: _terminal(ctl, run_id), f"run {run_id} failed")
    assert (state.status, state.failed_step) == ("failed", 1)
    assert state.failed_attempts == MEND_RETRY.max_attempts
    return run_id, state


def _terminal(ctl: Control, run_id: str) -> RunState | None:
    state = ctl.h.loop_state(run_id)
    return state if state is not None and state.terminal else None


def finish(ctl: Control, run_id: str) -> RunState:
    return ctl.play_timed(run_id, lambda: _terminal(ctl, run_id), f"run {run_id} terminal")


def after_redrive(facts: list[FactHeader], ordinal: int = 1) -> list[FactHeader]:
    """The facts after the run's ``ordinal``-th RunRedriven."""
    marks = [i for i, f in enumerate(facts) if isinstance(f, RunRedriven)]
    return facts[marks[ordinal - 1] + 1 :]


def outcomes(ctl: Control, run_id: str) -> list[str]:
    topology = ctl.h.deployment.topology
    records = read_topic(ctl.h.reader, ctl.h.name(TopicName.OUTCOMES), topology.partitions)
    decoded = [codec().decode_as(r.value, RunOutcome) for r in records]
    return [o.status for o in decoded if o.run_id == run_id]


def last_item(ctl: Control, run_id: str) -> WorkItem:
    return [i for i in ctl.h.work_items if i.run_id == run_id][-1]


def test_a_failed_run_is_redriven_with_its_provenance_and_succeeds(
    ctl: Control, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    run_id, failed = failed_mend(ctl, gate)
    failed_item = last_item(ctl, run_id)
    gate.touch()
    command, _ = ctl.redrive(run_id, operator="ops@example", reason="gate fixed")
    reply = ctl.reply(command)
    assert (reply.created, reply.refusal) == (True, None)
    answer = json.loads(reply.response or "{}")
    assert (answer["redrive"], answer["from_step"]) == (1, 1)

    redriven = ctl.one(run_id, RunRedriven)
    assert (redriven.command_id, redriven.operator, redriven.reason) == (
        command.command_id,
        "ops@example",
        "gate fixed",
    )
    assert (redriven.from_step, redriven.failed_step, redriven.redrive) == (1, 1, 1)
    assert (redriven.previous_execution, redriven.previous_recovery) == ("Failed", "NotRequired")
    assert redriven.previous_error == failed.error and "closed" in (failed.error or "")
    assert redriven.previous_error_type == "TransientError"
    assert (redriven.previous_segment, redriven.previous_generation) == (
        failed.attempt.segment,
        failed.attempt.generation,
    )
    assert redriven.previous_attempts == MEND_RETRY.max_attempts

    item = ctl.work(run_id)  # a new attempt: the next segment and generation, from step 1
    assert (item.segment, item.attempt, item.first_step) == (failed.attempt.segment + 1, 1, 1)
    assert item.generation == failed.attempt.generation + 1
    assert json.loads(item.input)["trail"] == ["intake"]  # step 0's output is kept
    running = ctl.state(run_id)
    assert (running.status, running.error, running.attempt.step_attempts) == ("running", None, 1)
    assert status_dict(running)["redrives"] == 1

    _, late = ctl.result(failed_item)  # the failed attempt answers late: stale
    assert ctl.rejection(late).reason == "stale_attempt"

    ctl.complete(item)
    state = ctl.terminal(run_id)
    assert state.status == "succeeded"
    assert json.loads(state.result or b"")["trail"] == ["intake", "check", "send"]
    again = after_redrive(ctl.facts(run_id))
    assert [f.step for f in again if isinstance(f, StepCompleted)] == [1, 2]
    assert isinstance(again[-1], RunSucceeded)
    # Terminal once before and once after the redrive, each published on runs.results.
    assert len(ctl.of(run_id, RunFailed)) == 1
    assert outcomes(ctl, run_id) == ["failed", "succeeded"]
    result = terminal_result(ctl.facts(run_id))
    assert result is not None and result.status == "succeeded"
    keys = [f.fact_key for f in ctl.facts(run_id)]
    assert len(keys) == len(set(keys))


def test_from_step_runs_the_earlier_steps_again(ctl: Control, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    run_id, failed = failed_mend(ctl, gate)
    gate.touch()
    command, _ = ctl.redrive(run_id, from_step=0)
    assert ctl.reply(command).created is True
    item = ctl.work(run_id)
    assert item.first_step == 0 and json.loads(item.input) == {"gate": str(gate)}
    assert ctl.state(run_id).completed_steps == ()
    ctl.complete(item)
    state = ctl.terminal(run_id)
    assert json.loads(state.result or b"")["trail"] == ["intake", "check", "send"]
    again = after_redrive(ctl.facts(run_id))
    ran = [(f.step, f.generation) for f in again if isinstance(f, StepCompleted)]
    assert ran == [(s, failed.attempt.generation + 1) for s in (0, 1, 2)]
    assert state.completed_steps == (0, 1, 2)


def test_a_redriven_run_gets_a_fresh_retry_budget_and_can_be_redriven_again(
    ctl: Control, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    run_id, _ = failed_mend(ctl, gate)
    first, _ = ctl.redrive(run_id)  # the gate is still closed: it fails again
    assert ctl.reply(first).created is True
    state = finish(ctl, run_id)
    assert (state.status, state.failed_attempts) == ("failed", MEND_RETRY.max_attempts)
    second_try = after_redrive(ctl.facts(run_id))
    assert len([f for f in second_try if isinstance(f, SegmentAttemptStarted)]) == 3
    gate.touch()
    second, _ = ctl.redrive(run_id)
    assert json.loads(ctl.reply(second).response or "{}")["redrive"] == 2
    assert finish(ctl, run_id).status == "succeeded"
    facts = ctl.facts(run_id)
    assert [f.redrive for f in facts if isinstance(f, RunRedriven)] == [1, 2]
    assert outcomes(ctl, run_id) == ["failed", "failed", "succeeded"]
    keys = [f.fact_key for f in facts]
    assert len(keys) == len(set(keys)), "no fact of a redrive is dropped as a duplicate"


def test_the_same_command_twice_is_one_redrive(ctl: Control, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    run_id, _ = failed_mend(ctl, gate)
    gate.touch()
    command, _ = ctl.redrive(run_id)
    ctl.h.produce_model(TopicName.COMMANDS, run_id, command)  # delivered again
    first, repeat = ctl.replies_to(command, 2)
    assert (first.created, repeat.created) == (True, False)
    assert (repeat.refusal, repeat.detail) == (None, "already applied")
    assert repeat.response == first.response
    assert finish(ctl, run_id).status == "succeeded"
    ctl.h.produce_model(TopicName.COMMANDS, run_id, command)  # and once it succeeded
    assert ctl.replies_to(command, 3)[2].response == first.response
    assert len(ctl.of(run_id, RunRedriven)) == 1
    started = after_redrive(ctl.facts(run_id))
    assert len([f for f in started if isinstance(f, SegmentAttemptStarted)]) == 1
    assert outcomes(ctl, run_id) == ["failed", "succeeded"]


def _refused(ctl: Control, run_id: str, reason: str, from_step: int | None = None) -> str:
    before = ctl.facts_count(run_id)
    command, _ = ctl.redrive(run_id, from_step)
    reply = ctl.reply(command)
    assert (reply.created, reply.refusal) == (False, reason), reply
    assert ctl.facts_count(run_id) == before, "a refused redrive changes nothing"
    return reply.detail or ""


def test_a_run_that_is_not_failed_is_refused(ctl: Control, tmp_path: Path) -> None:
    running = ctl.submit("mend", {"gate": str(tmp_path / "never")})
    assert "running" in _refused(ctl, running, "not_failed")
    (tmp_path / "open").touch()
    succeeded = ctl.submit("mend", {"gate": str(tmp_path / "open")})
    assert finish(ctl, succeeded).status == "succeeded"
    assert "succeeded" in _refused(ctl, succeeded, "not_failed")
    assert _refused(ctl, "no-such-run", "unknown_run") == "no run no-such-run"


def test_a_step_outside_the_failed_range_is_refused(ctl: Control, tmp_path: Path) -> None:
    run_id, _ = failed_mend(ctl, tmp_path / "gate")
    assert "from 0 to the failed step 1, got 2" in _refused(ctl, run_id, "bad_step", 2)
    assert "got -1" in _refused(ctl, run_id, "bad_step", -1)
    assert ctl.state(run_id).status == "failed"


def test_a_failed_run_that_was_compensated_is_refused(ctl: Control) -> None:
    run_id = ctl.submit("booking", {"id": "r-1", "reject": True})
    state = ctl.play(run_id)
    assert (state.status, state.recovery) == ("failed", "PartiallyCompensated")
    assert "unwound" in _refused(ctl, run_id, "compensated")


@pytest.mark.parametrize("from_step", [None, 0])
def test_the_client_redrives_and_waits_for_the_new_outcome(
    ctl: Control, tmp_path: Path, from_step: int | None
) -> None:
    gate = tmp_path / "gate"
    run_id, _ = failed_mend(ctl, gate)
    gate.touch()
    client = ctl.client()
    try:
        answer: list[object] = []
        asking = threading.Thread(target=lambda: answer.append(client.redrive(run_id, from_step)))
        asking.start()
        ctl.drive(lambda: ctl.of(run_id, RunRedriven), "the redrive")
        asking.join(30)
        reply = answer[0]
        assert getattr(reply, "created", None) is True
        finish(ctl, run_id)
        assert client.wait(run_id, timeout_s=10).status == "succeeded"
    finally:
        client.close()


def _answer(ctl: Control, request: BoundaryRequest, outcome: str, value: object) -> Record:
    completion = BoundaryCompletion(
        token=request.resume_token,
        idempotency_key=f"k-{request.interaction}-{outcome}",
        outcome=outcome,  # type: ignore[arg-type]
        payload=json.dumps(value).encode() if outcome == "success" else b"",
        error="declined" if outcome == "failure" else None,
    )
    return ctl.h.produce_model(TopicName.COMPLETIONS, request.run_id, completion)


def test_a_run_failed_at_an_await_asks_again_with_new_interactions(ctl: Control) -> None:
    run_id = ctl.submit("survey", {"n": 7, "items": 2})
    ctl.complete(ctl.work(run_id))
    ctl.drive(lambda: len(ctl.requests_of(run_id)) == 2, "both questions asked")
    first, second = ctl.requests_of(run_id)
    ctl.consumed(_answer(ctl, first, "failure", None))
    failed = ctl.terminal(run_id)
    assert (failed.status, failed.failed_step, failed.recovery) == ("failed", 0, "NotRequired")

    command, _ = ctl.redrive(run_id)
    assert ctl.reply(command).created is True
    ctl.complete(ctl.work(run_id))  # the await step again: a new boundary
    asked = ctl.drive(
        lambda: (found := ctl.requests_of(run_id)[2:]) and len(found) == 2 and found,
        "the questions asked again",
    )
    assert {r.boundary for r in asked} == {failed.boundary.number + 1}
    assert {r.resume_token for r in asked}.isdisjoint({first.resume_token, second.resume_token})
    late = _answer(ctl, second, "success", "late")  # the failed attempt's open question
    assert ctl.rejection(late).reason == "unknown_interaction"
    for index, request in enumerate(asked):
        ctl.consumed(_answer(ctl, request, "success", index))
    state = finish(ctl, run_id)
    assert state.status == "succeeded"
    assert json.loads(state.result or b"") == expected_survey_result([0, 1])
