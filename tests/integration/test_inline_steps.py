"""Segments run where they are decided (``PROCESSOR_INLINE_STEPS``, ``engine/inline.py``).

With inline steps on, the processor runs a quick sync segment of a pipeline its own
application loads before it commits: no work item out, no result back, and what
follows the segment commits with the decision that dispatched it. These hosts have no
workers at all, so only the processor itself can have run a step.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from processor.clients.client import Client, new_submit
from processor.engine.host import Host
from processor.facts.codec import codec, decode_fact
from processor.facts.models import (
    BoundaryRequest,
    CancelRun,
    RetryScheduled,
    RunSucceeded,
    SegmentCompleted,
    StepCompleted,
)
from processor.facts.topics import TopicName
from processor.model.pipeline_spec import RetryPolicy
from processor.transport.deployment import Deployment
from processor.worker.pipeline import Application, Pipeline
from tests.apps.boundary_pipelines import scalar
from tests.apps.pipelines import expected_steps3_result, steps3
from tests.apps.support import read_topic, wait_until
from tests.kafka.support import hosted

TRANSPORTS = ["embedded", pytest.param("kafka", marks=pytest.mark.kafka)]

retried = Pipeline("inline_retried")
_failed_once: set[str] = set()


@retried.step(retry=RetryPolicy(max_attempts=3, initial_backoff_ms=10))
def shaky(order: dict[str, Any]) -> dict[str, Any]:
    if order["id"] not in _failed_once:  # each run's first attempt fails
        _failed_once.add(order["id"])
        raise RuntimeError("the first attempt fails")
    return {"ok": order["id"]}


awaiting = Pipeline("inline_async")


@awaiting.step()
async def slow(order: dict[str, Any]) -> dict[str, Any]:
    return order


declined = Pipeline("inline_declined", inline=False)


@declined.step()
def quick(order: dict[str, Any]) -> dict[str, Any]:
    return order


step_declined = Pipeline("inline_step_declined")


@step_declined.step()
def quick_first(order: dict[str, Any]) -> dict[str, Any]:
    return order


@step_declined.step(inline=False)
def slow_second(order: dict[str, Any]) -> dict[str, Any]:
    return order


heartbeating = Pipeline("inline_heartbeats")


@heartbeating.step(heartbeat_timeout_s=30)
def long_running(order: dict[str, Any]) -> dict[str, Any]:
    return order


counted = Pipeline("inline_counted")
_ran: Counter[str] = Counter()


@counted.step()
def count(order: dict[str, Any]) -> dict[str, Any]:
    _ran[order["id"]] += 1
    return order


app = Application(
    [steps3, scalar, retried, awaiting, declined, step_declined, heartbeating, counted]
)


@dataclass
class Inline:
    host: Host
    client: Client
    deployment: Deployment

    def records(self, topic: TopicName) -> list[Any]:
        reader = self.deployment.transport.reader()
        try:
            topology = self.deployment.topology
            found = read_topic(reader, topology.name(topic), topology.partitions)
            return [record for record in found]
        finally:
            reader.close()

    def history(self, run_id: str) -> list[Any]:
        facts = [decode_fact(r.value) for r in self.records(TopicName.FACTS)]
        return [fact for fact in facts if fact.run_id == run_id]

    def commits_after(self, action: Callable[[], object], until: Callable[[], bool]) -> int:
        """The processor's commits from ``action`` until ``until`` holds (nothing else
        makes it commit here: no workers, no other runs)."""
        loop = self.host.loop
        assert loop is not None
        before = loop.committed_batches
        action()
        # What a commit wrote is visible a moment before the loop counts the commit.
        wait_until(lambda: until() and loop.committed_batches > before, 60, "the commits")
        return loop.committed_batches - before


@pytest.fixture(params=TRANSPORTS)
def inline(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Inline]:
    def host_of(deployment: Deployment) -> Host:
        return Host(deployment, app, workers=0)

    with hosted(request.param, tmp_path, host_of, inline_steps=True) as (host, client):
        yield Inline(host, client, host.deployment)


def _run_ids(records: list[Any]) -> set[str]:
    return {record.key.decode() for record in records}


def test_a_run_of_quick_steps_is_run_by_the_processor_in_one_commit(inline: Inline) -> None:
    receipt: list[str] = []

    def submit() -> None:
        receipt.append(inline.client.submit("steps3", {"n": 4}).run_id)

    def ended() -> bool:
        return bool(receipt) and _ended(inline, receipt[0])

    commits = inline.commits_after(submit, ended)
    (run_id,) = receipt
    outcome = inline.client.wait(run_id, 5)
    assert outcome.status == "succeeded" and outcome.output == expected_steps3_result(4)
    assert commits == 1  # submitted, its three steps run, succeeded: one transaction
    history = inline.history(run_id)
    steps = [f for f in history if isinstance(f, StepCompleted)]
    assert [f.step for f in steps] == [0, 1, 2]
    (segment,) = [f for f in history if isinstance(f, SegmentCompleted)]
    assert segment.last_step == 2
    # Nothing went through the workers' topics.
    assert run_id not in _run_ids(inline.records(TopicName.WORK))
    assert run_id not in _run_ids(inline.records(TopicName.RESULTS))


def test_an_await_is_dispatched_with_the_steps_before_it_and_resumed_in_one_commit(
    inline: Inline,
) -> None:
    run_ids: list[str] = []

    def requests() -> list[BoundaryRequest]:
        records = inline.records(TopicName.REQUESTS)
        found = [codec().decode_as(r.value, BoundaryRequest) for r in records]
        return [r for r in found if r.run_id in run_ids]

    submitted = inline.commits_after(
        lambda: run_ids.append(inline.client.submit("scalar", {"n": 7}).run_id),
        lambda: bool(requests()),
    )
    assert submitted == 1  # the submit, the step before the await, its request
    (request,) = requests()
    (run_id,) = run_ids

    def succeeded() -> bool:
        return any(isinstance(f, RunSucceeded) for f in inline.history(run_id))

    answered = inline.commits_after(
        lambda: inline.client.complete(request.resume_token, 49), succeeded
    )
    assert answered == 1  # the completion admitted, the last step run, succeeded
    assert inline.client.wait(run_id, 5).output == {"answer": 49}
    assert run_id not in _run_ids(inline.records(TopicName.WORK))


def test_a_failed_inline_step_is_retried_after_its_backoff(inline: Inline) -> None:
    order = f"o-{uuid.uuid4().hex[:8]}"
    run_id = inline.client.submit("inline_retried", {"id": order}).run_id
    outcome = inline.client.wait(run_id, 30)
    assert outcome.status == "succeeded" and outcome.output == {"ok": order}
    history = inline.history(run_id)
    assert len([f for f in history if isinstance(f, RetryScheduled)]) == 1
    assert run_id not in _run_ids(inline.records(TopicName.WORK))


@pytest.mark.parametrize(
    "pipeline",
    ["inline_async", "inline_declined", "inline_step_declined", "inline_heartbeats"],
)
def test_an_async_heartbeating_or_declined_step_is_left_to_the_workers(
    inline: Inline, pipeline: str
) -> None:
    run_id = inline.client.submit(pipeline, {"id": "o-2"}).run_id
    # No worker here: the work item waits on segments.work, and the run with it.
    wait_until(lambda: run_id in _run_ids(inline.records(TopicName.WORK)), 30, "the work item")
    status = inline.client.status(run_id)
    assert status is not None and status.status == "running"


def _ended(inline: Inline, run_id: str) -> bool:
    status = inline.client.status(run_id)
    return status is not None and status.status != "running"


def test_a_run_cancelled_in_the_batch_that_submits_it_runs_no_step(inline: Inline) -> None:
    order = f"o-{uuid.uuid4().hex[:8]}"
    submit = new_submit("inline_counted", {"id": order})
    cancel = CancelRun(command_id=str(uuid.uuid4()), run_id=submit.run_id, requested_ms=0)
    inline.client.send(submit)
    inline.client.send(cancel)
    inline.client.flush()  # on the embedded log one commit: the loop polls both at once
    wait_until(lambda: _ended(inline, submit.run_id), 30, "the run to end")
    status = inline.client.status(submit.run_id)
    assert status is not None and status.status == "cancelled", status
    if inline.host.deployment.transport.name == "embedded":  # Kafka may split the two
        assert _ran[order] == 0  # its attempt was not run: as a worker given a stop notice
