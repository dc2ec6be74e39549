"""A duplicate storm across a restart: every completion three times, shuffled.

The processor loop is stopped in the middle of the storm and a new one is
started on the same data dir (and, on Kafka, the same topics and group). Each
interaction must be admitted exactly once; an identical duplicate is a no-op (no
fact, no rejection), while the same token with another payload is refused as
``conflicting_completion``.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from processor.config.settings import Settings
from processor.facts.models import (
    BoundaryCompletion,
    BoundaryCompletionAdmitted,
    BoundaryRequest,
    FactHeader,
)
from processor.facts.topics import TopicName
from processor.restore.replay import replay
from tests.apps.control_pipelines import app, expected_approval_result, expected_survey_result
from tests.apps.support import FakeClock, LoopHarness, transport_settings
from tests.control.control_support import Control

SECRET = b"duplicate-storm-secret-0123456789"
SEED = 20_250_611
APPROVALS = 12
SURVEYS = 6
ITEMS = 3
COPIES = 3


@pytest.fixture(params=["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    return transport_settings(request.param, tmp_path)


@pytest.fixture
def controls() -> Iterator[list[Control]]:
    started: list[Control] = []
    try:
        yield started
    finally:
        for control in started:
            control.close()


def _start(settings: Settings, controls: list[Control]) -> Control:
    previous = controls[-1] if controls else None
    clock = FakeClock()
    if previous is not None:
        previous.close()  # stop the loop; the next one resumes from committed offsets
        clock = previous.h.clock
    h = LoopHarness(settings.data_dir, app, clock, settings=settings, secret=SECRET)
    control = Control(h, previous, owned=True)
    controls.append(control)
    return control


def _answer(request: BoundaryRequest) -> int:
    return int(json.loads(request.request)["approve"]) * 7


def _completion(request: BoundaryRequest, *, answer: int | None = None) -> BoundaryCompletion:
    value = _answer(request) if answer is None else answer
    return BoundaryCompletion(
        token=request.resume_token,
        idempotency_key=f"answer-{request.run_id}-{request.interaction}",
        outcome="success",
        payload=json.dumps(value).encode(),
    )


def _shape(facts: list[FactHeader]) -> list[str]:
    return [type(f).__name__ for f in facts]


def _suspend_all(
    ctl: Control, runs: list[tuple[str, dict[str, int]]]
) -> dict[str, list[BoundaryRequest]]:
    """Submit the runs and play the worker until each waits with all its requests out."""
    run_ids = ctl.submit_many(runs)
    expected = {
        run_id: ITEMS if pipeline == "survey" else 1
        for run_id, (pipeline, _) in zip(run_ids, runs, strict=True)
    }

    def all_asked() -> bool:
        ctl.requests_of("")  # read what was dispatched since the last call
        asked = all(len(ctl.requests_of(r, refresh=False)) == n for r, n in expected.items())
        return asked and all(ctl.h.suspended(r) for r in run_ids)

    ctl.play_all(run_ids, all_asked, "every run waiting at its await")
    return {run_id: ctl.requests_of(run_id) for run_id in run_ids}


def test_each_completion_three_times_across_a_restart_is_admitted_once(
    settings: Settings, controls: list[Control]
) -> None:
    ctl = _start(settings, controls)
    rng = random.Random(SEED)

    # Reference runs, completed once each: the facts a run must end with.
    reference = _suspend_all(ctl, [("approval", {"n": 0}), ("survey", {"n": 0, "items": ITEMS})])
    for found in reference.values():
        for request in found:
            ctl.h.produce_model(TopicName.COMPLETIONS, request.run_id, _completion(request))
    ctl.play_all(
        list(reference),
        lambda: all(ctl.state(r).terminal for r in reference),
        "the reference runs to finish",
    )
    shapes = {ctl.state(r).pipeline: _shape(ctl.facts(r)) for r in reference}

    runs = [("approval", {"n": n}) for n in range(1, APPROVALS + 1)] + [
        ("survey", {"n": n, "items": ITEMS}) for n in range(APPROVALS + 1, APPROVALS + SURVEYS + 1)
    ]
    waiting = _suspend_all(ctl, runs)
    pipelines = {run_id: ctl.state(run_id).pipeline for run_id in waiting}
    requests = [request for found in waiting.values() for request in found]
    assert len(requests) == APPROVALS + SURVEYS * ITEMS

    storm = [request for request in requests for _ in range(COPIES)]
    rng.shuffle(storm)
    half = len(storm) // 2
    for request in storm[:half]:
        ctl.h.produce_model(
            TopicName.COMPLETIONS, request.run_id, _completion(request), flush=False
        )
    ctl.h.producer.flush()
    admitted = Counter[tuple[str, str]]()

    def count_admissions() -> int:
        admitted.clear()
        for run_id in pipelines:
            for fact in ctl.of(run_id, BoundaryCompletionAdmitted):
                admitted[(run_id, fact.interaction)] += 1
        return sum(admitted.values())

    ctl.drive(lambda: count_admissions() > 0, "the storm to be partly admitted")
    before_restart = {(r.run_id, r.interaction) for r in storm[:half]}
    after_restart = {(r.run_id, r.interaction) for r in storm[half:]}
    assert before_restart & after_restart, "some interaction's copies must span the restart"

    ctl = _start(settings, controls)  # stop mid-storm; a new loop on the same data dir
    for request in storm[half:]:
        ctl.h.produce_model(
            TopicName.COMPLETIONS, request.run_id, _completion(request), flush=False
        )
    ctl.h.producer.flush()
    ctl.play_all(
        list(pipelines),
        lambda: all(ctl.state(r).terminal for r in pipelines),
        "every run to finish",
    )

    count_admissions()
    assert set(admitted) == {(r.run_id, r.interaction) for r in requests}
    assert set(admitted.values()) == {1}, "an interaction was admitted more than once"
    completions = ctl.h.name(TopicName.COMPLETIONS)
    refused = [r for r in ctl.h.rejected.refresh() if r.source_topic == completions]
    assert refused == [], [(r.reason, r.detail) for r in refused]
    for run_id, pipeline in pipelines.items():
        facts = ctl.facts(run_id)
        assert _shape(facts) == shapes[pipeline], run_id  # duplicates added no fact
        assert [f.seq for f in facts] == list(range(1, len(facts) + 1))
        assert len({f.fact_key for f in facts}) == len(facts)
        answers = [_answer(r) for r in requests if r.run_id == run_id]
        result = json.loads(ctl.state(run_id).result or b"")
        if pipeline == "approval":
            assert result == expected_approval_result(answers[0])
        else:
            assert result == expected_survey_result(answers)

    # The same token with another payload is not a duplicate: it is refused.
    target = requests[0]
    before = ctl.facts_count(target.run_id)
    record = ctl.h.produce_model(
        TopicName.COMPLETIONS, target.run_id, _completion(target, answer=-1)
    )
    assert ctl.rejection(record).reason == "conflicting_completion"
    assert ctl.facts_count(target.run_id) == before

    deployment = ctl.h.deployment
    report = replay(
        deployment.transport, deployment.topology, deployment.settings.state_dir, verify=True
    )
    assert report.verified is True, report.differences
