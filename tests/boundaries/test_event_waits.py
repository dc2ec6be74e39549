"""Event waits end to end on both transports: an event addressed to a run settles its
wait through the admission stage (model/event_waits.py, docs/design/signals.md).

One loop per transport for the module (the runs are independent); the fake clock
only moves forward, and each test reads its own deadlines.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from processor.facts.json_wire import event_headers
from processor.facts.models import (
    BoundaryCompletionAdmitted,
    InteractionTimedOut,
    Rejected,
    SignalEvent,
)
from processor.facts.payload import derive_run_id
from processor.facts.topics import TopicName
from processor.model import waits
from processor.model.continuation import TIMED_OUT
from processor.transport.base import Record, TopicPartition
from processor.transport.partitioner import partition_for
from tests.apps.event_pipelines import EVENT_TIMEOUT_S, app
from tests.apps.support import LoopHarness, transport_settings
from tests.boundaries.test_awaits import finish, play, status
from tests.control.control_support import timers_held

EVENT_MS = int(EVENT_TIMEOUT_S * 1000)


@pytest.fixture(scope="module", params=["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def h(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    path: Path = tmp_path_factory.mktemp(f"events-{request.param}")
    harness = LoopHarness.for_settings(transport_settings(request.param, path), app)
    try:
        yield harness
    finally:
        harness.close()


def send(
    h: LoopHarness,
    run_id: str,
    name: str,
    value: Any,
    *,
    correlation: dict[str, str] | None = None,
    event_id: str | None = None,
) -> Record:
    event = SignalEvent(
        event_id=event_id or uuid.uuid4().hex,
        name=name,
        run_id=run_id,
        correlation=correlation or {},
        payload=json.dumps(value).encode(),
    )
    return h.produce_model(TopicName.EVENTS, run_id, event)


def refused(h: LoopHarness, record: Record) -> Rejected:
    return h.drive(lambda: h.rejected.find(record), "the event refused")


def admitted(h: LoopHarness, run_id: str) -> list[BoundaryCompletionAdmitted]:
    return [f for f in h.facts(run_id) if isinstance(f, BoundaryCompletionAdmitted)]


def waiting(h: LoopHarness, pipeline: str, value: Any) -> str:
    run_id = h.submit(pipeline, value)
    play(h, lambda: h.suspended(run_id), "the run waits for its event")
    return run_id


def order(n: int) -> dict[str, str]:
    return {"order": f"o-{n}-{uuid.uuid4().hex[:6]}", "region": "eu"}


def test_an_event_after_the_wait_registers_settles_it(h: LoopHarness) -> None:
    value = order(1)
    run_id = waiting(h, "paid", value)
    state = h.loop_state(run_id)
    assert state is not None
    shown = waits.SUSPENDED.shows(state)
    assert shown is not None and shown["event"]["name"] == "payment_received"
    assert shown["event"]["correlation"] == value and shown["event"]["key"] == value["order"]
    assert shown["event"]["deadline_ms"] == h.clock() + EVENT_MS
    send(h, run_id, "payment_received", {"amount": 5}, correlation=value)
    finish(h, run_id)
    final = h.loop_state(run_id)
    assert final is not None and final.status == "succeeded"
    assert json.loads(final.result or b"") == {"shipped": {"amount": 5}}
    (fact,) = admitted(h, run_id)
    assert fact.source == "event"


def test_an_event_before_the_wait_registers_is_refused_and_not_kept(h: LoopHarness) -> None:
    value = order(2)
    run_id = h.submit("paid", value)
    h.drive(lambda: h.loop_state(run_id) is not None, "the run accepted")
    early = send(h, run_id, "payment_received", {"early": True}, correlation=value)
    assert refused(h, early).reason == "no_matching_wait"
    play(h, lambda: h.suspended(run_id), "the wait registered")
    assert admitted(h, run_id) == []  # the early event was not buffered
    send(h, run_id, "payment_received", {"late": True}, correlation=value)
    finish(h, run_id)
    final = h.loop_state(run_id)
    assert final is not None and json.loads(final.result or b"") == {"shipped": {"late": True}}


def test_correlation_is_a_subset_match(h: LoopHarness) -> None:
    value = order(3)
    run_id = waiting(h, "paid", value)
    wrong = send(h, run_id, "payment_received", 1, correlation={**value, "region": "us"})
    assert refused(h, wrong).reason == "no_matching_wait"
    partial = send(h, run_id, "payment_received", 2, correlation={"order": value["order"]})
    assert refused(h, partial).reason == "no_matching_wait"
    other_name = send(h, run_id, "payment_refunded", 3, correlation=value)
    assert refused(h, other_name).reason == "no_matching_wait"
    assert h.suspended(run_id) and admitted(h, run_id) == []
    send(h, run_id, "payment_received", 4, correlation={**value, "extra": "more"})
    finish(h, run_id)
    final = h.loop_state(run_id)
    assert final is not None and json.loads(final.result or b"") == {"shipped": 4}


def test_the_same_event_id_twice_is_admitted_once(h: LoopHarness) -> None:
    run_id = waiting(h, "poked", {"n": 1})
    send(h, run_id, "poke", "first", event_id="evt-1")
    finish(h, run_id)
    again = send(h, run_id, "poke", "second copy", event_id="evt-1")
    # A refused event behind the copy, on the same partition: once it is decided, so was
    # the copy (a no-op: nothing admitted, nothing rejected).
    marker = send(h, run_id, "poke", "marker")
    assert refused(h, marker).reason == "run_terminal"
    assert h.rejected.find(again) is None
    assert len(admitted(h, run_id)) == 1
    final = h.loop_state(run_id)
    assert final is not None and json.loads(final.result or b"") == {"poked": "first"}


def test_an_event_at_the_deadline_loses_when_decided_first(h: LoopHarness) -> None:
    value = order(5)
    run_id = waiting(h, "paid", value)
    deadline = h.clock() + EVENT_MS
    h.clock.advance_to(deadline)
    with timers_held(h):  # the event is decided before the (due) timer is scanned
        late = send(h, run_id, "payment_received", "late", correlation=value)
        assert refused(h, late).reason == "late_completion"
    h.drive(lambda: status(h, run_id) == "failed", "the run failed by the timeout")
    facts = h.facts(run_id)
    assert admitted(h, run_id) == []
    assert sum(isinstance(f, InteractionTimedOut) for f in facts) == 1


def test_an_event_at_the_deadline_loses_when_the_timer_fired_first(h: LoopHarness) -> None:
    value = order(6)
    run_id = waiting(h, "paid", value)
    h.clock.advance_to(h.clock() + EVENT_MS)
    h.drive(lambda: status(h, run_id) == "failed", "the run failed by the timeout")
    late = send(h, run_id, "payment_received", "late", correlation=value)
    assert refused(h, late).reason == "run_terminal"
    assert admitted(h, run_id) == []


def test_an_event_just_before_the_deadline_wins(h: LoopHarness) -> None:
    run_id = waiting(h, "poked", {"n": 2})
    h.clock.advance_to(h.clock() + EVENT_MS - 1)
    with timers_held(h):
        send(h, run_id, "poke", "in time")
        h.drive(lambda: admitted(h, run_id), "admitted")
    finish(h, run_id)
    final = h.loop_state(run_id)
    assert final is not None and json.loads(final.result or b"") == {"poked": "in time"}


def test_a_zero_timeout_only_times_out(h: LoopHarness) -> None:
    run_id = h.submit("instant", {"n": 1})
    finish(h, run_id)
    late = send(h, run_id, "never", "too late")
    assert refused(h, late).reason == "run_terminal"
    final = h.loop_state(run_id)
    assert final is not None and json.loads(final.result or b"") == {"got": TIMED_OUT}
    assert admitted(h, run_id) == []


def test_events_for_no_run_are_refused_with_a_reason(h: LoopHarness) -> None:
    stray = send(h, f"nobody-{uuid.uuid4().hex}", "poke", 1)
    assert refused(h, stray).reason == "unknown_run"


def test_a_malformed_event_is_refused(h: LoopHarness) -> None:
    run_id = waiting(h, "poked", {"n": 3})
    event = SignalEvent(event_id="", name="poke", run_id=run_id, payload=b"1")
    record = h.produce_model(TopicName.EVENTS, run_id, event)
    assert refused(h, record).reason == "malformed"
    garbage = h.produce(TopicName.EVENTS, run_id, b"\x00not avro")
    assert refused(h, garbage).reason
    assert h.suspended(run_id)


def test_an_event_wait_in_a_graph_lane(h: LoopHarness) -> None:
    case = uuid.uuid4().hex[:8]
    run_id = h.submit("graph_paid", {"case": case, "n": 4})
    play(h, lambda: _event_wait_registered(h, run_id), "the graph's event wait registered")
    wrong = send(h, run_id, "approved", "no", correlation={"case": "other"})
    assert refused(h, wrong).reason == "no_matching_wait"
    send(h, run_id, "approved", "yes", correlation={"case": case})
    finish(h, run_id)
    final = h.loop_state(run_id)
    assert final is not None and final.status == "succeeded"
    assert json.loads(final.result or b"") == {"closed": {"approval": "yes", "tally": 8}}


def _event_wait_registered(h: LoopHarness, run_id: str) -> bool:
    state = h.loop_state(run_id)
    return state is not None and any(i.kind == "event" for i in state.interactions.values())


# --- events by correlation key ---------------------------------------------------------------


def runs_on_two_partitions(h: LoopHarness, pipeline: str, value: Any) -> list[str]:
    """Two runs of ``pipeline`` waiting for their event, on two different partitions."""
    partitions = h.deployment.topology.partitions
    chosen: dict[int, str] = {}
    prefix = uuid.uuid4().hex
    for i in range(1000):
        key = f"{prefix}-{i}"
        chosen.setdefault(partition_for(derive_run_id(key).encode(), partitions), key)
        if len(chosen) == 2:
            break
    run_ids = [h.submit(pipeline, value, idempotency_key=key) for key in chosen.values()]
    play(h, lambda: all(h.suspended(r) for r in run_ids), "both runs wait for their event")
    return run_ids


def send_by_key(
    h: LoopHarness, key: str, name: str, value: Any, correlation: dict[str, str] | None = None
) -> Record:
    event = SignalEvent(
        event_id=uuid.uuid4().hex,
        name=name,
        correlation_key=key,
        correlation=correlation or {},
        payload=json.dumps(value).encode(),
    )
    return h.produce_model(TopicName.EVENTS, key, event)


def test_an_event_by_key_reaches_every_run_waiting_on_it_on_any_partition(h: LoopHarness) -> None:
    value = order(7)
    first, second = runs_on_two_partitions(h, "paid", value)
    partitions = h.deployment.topology.partitions
    assert partition_for(first.encode(), partitions) != partition_for(second.encode(), partitions)
    other_region = waiting(h, "paid", {**value, "region": "us"})
    other_order = waiting(h, "paid", order(8))
    send_by_key(h, value["order"], "payment_received", {"paid": 9}, {"region": "eu"})
    finish(h, first)
    finish(h, second)
    for run_id in (first, second):
        final = h.loop_state(run_id)
        assert final is not None and json.loads(final.result or b"") == {"shipped": {"paid": 9}}
        assert len(admitted(h, run_id)) == 1
    # The run of the same key in another region refused its copy, with the reason; a run
    # waiting on another key was not asked.
    mismatch = h.drive(lambda: _rejected_for(h, other_region), "the mismatch refused")
    assert mismatch.reason == "no_matching_wait"
    assert h.suspended(other_region) and admitted(h, other_region) == []
    assert h.suspended(other_order) and admitted(h, other_order) == []
    assert _rejected_for(h, other_order) is None


def _rejected_for(h: LoopHarness, run_id: str) -> Rejected | None:
    return next((r for r in h.rejected.refresh() if r.run_id == run_id), None)


def test_an_event_by_key_before_the_wait_registers_does_not_reach_it(h: LoopHarness) -> None:
    value = order(9)
    run_id = h.submit("paid", value)
    h.drive(lambda: h.loop_state(run_id) is not None, "the run accepted")
    early = send_by_key(h, value["order"], "payment_received", "early", {"region": "eu"})
    # Refused as a whole: it was decided before the wait registered, and no other run
    # waits on the key.
    assert refused(h, early).reason == "no_matching_wait"
    play(h, lambda: h.suspended(run_id), "the wait registered")
    send_by_key(h, value["order"], "payment_received", "late", {"region": "eu"})
    finish(h, run_id)
    final = h.loop_state(run_id)
    assert final is not None and json.loads(final.result or b"") == {"shipped": "late"}
    assert len(admitted(h, run_id)) == 1


def test_an_event_by_key_that_no_run_admits_is_refused_once_with_a_reason(
    h: LoopHarness,
) -> None:
    value = order(13)
    other_region = waiting(h, "paid", {**value, "region": "us"})
    topic = h.name(TopicName.EVENTS)
    partitions = range(h.deployment.topology.partitions)
    ends = [h.reader.end_offset(TopicPartition(topic, p)) for p in partitions]
    nobody = send_by_key(h, f"o-nobody-{uuid.uuid4().hex[:6]}", "payment_received", "lost?")
    refusal = refused(h, nobody)
    assert (refusal.reason, refusal.run_id) == ("no_matching_wait", None)
    assert "no run admitted" in refusal.detail
    # A run of the key whose correlation does not match refuses its part with its run
    # id, and the event as a whole is refused too: nothing admitted it.
    mismatched = send_by_key(h, value["order"], "payment_received", 1, {"region": "eu"})
    h.drive(
        lambda: any(r.run_id is None for r in _refusals_of(h, mismatched)),
        "the mismatched event refused",
    )
    refusals = _refusals_of(h, mismatched)
    assert sorted((r.run_id or "", r.reason) for r in refusals) == [
        ("", "no_matching_wait"),
        (other_region, "no_matching_wait"),
    ]
    assert h.suspended(other_region) and admitted(h, other_region) == []
    # One processor owns every partition here: the events went through them all without
    # a record more on boundary.events than the two sent.
    after = [h.reader.end_offset(TopicPartition(topic, p)) for p in partitions]
    assert sum(after) - sum(ends) == 2


def test_a_copy_made_by_an_older_processor_is_decided_for_its_own_partition_only(
    h: LoopHarness,
) -> None:
    # Before events by key went through the partitions, the key's owner copied them to
    # every partition (fanned_out, no visited): a copy left in the log at an upgrade is
    # decided for the runs of the partition it is on, and never refused as a whole.
    value = order(14)
    run_id = waiting(h, "paid", value)
    partitions = h.deployment.topology.partitions
    here = partition_for(run_id.encode(), partitions)
    placed = next(
        k for k in (f"k{i}" for i in range(1000)) if partition_for(k.encode(), partitions) == here
    )

    def copy(key: str, paid: int) -> Record:
        event = SignalEvent(
            event_id=uuid.uuid4().hex,
            name="payment_received",
            correlation_key=key,
            correlation={"region": "eu"},
            payload=json.dumps({"paid": paid}).encode(),
            fanned_out=True,
        )
        return h.produce_model(TopicName.EVENTS, placed, event)

    nobody = copy(f"o-nobody-{uuid.uuid4().hex[:6]}", 1)
    copy(value["order"], 2)
    finish(h, run_id)
    final = h.loop_state(run_id)
    assert final is not None and json.loads(final.result or b"") == {"shipped": {"paid": 2}}
    assert _refusals_of(h, nobody) == []


def _refusals_of(h: LoopHarness, source: Record) -> list[Rejected]:
    h.rejected.refresh()
    return [
        r
        for r in h.rejected.seen
        if (r.source_topic, r.source_partition, r.source_offset)
        == (source.topic, source.partition, source.offset)
    ]


def test_an_event_in_json_settles_a_wait_by_run_id_and_by_key(h: LoopHarness) -> None:
    # A producer without Avro: the JSON shape of json_wire, named by the headers.
    by_id = order(11)
    run_id = waiting(h, "paid", by_id)
    document = {
        "event_id": uuid.uuid4().hex,
        "name": "payment_received",
        "run_id": run_id,
        "correlation": by_id,
        "payload": {"amount": 3},
    }
    h.produce(TopicName.EVENTS, run_id, json.dumps(document).encode(), headers=event_headers())
    finish(h, run_id)
    final = h.loop_state(run_id)
    assert final is not None and json.loads(final.result or b"") == {"shipped": {"amount": 3}}

    by_key = order(12)
    keyed = waiting(h, "paid", by_key)
    document = {
        "event_id": uuid.uuid4().hex,
        "name": "payment_received",
        "correlation_key": by_key["order"],
        "correlation": {"region": by_key["region"]},
        "payload": {"amount": 4},
    }
    key = by_key["order"]
    h.produce(TopicName.EVENTS, key, json.dumps(document).encode(), headers=event_headers())
    finish(h, keyed)
    final = h.loop_state(keyed)
    assert final is not None and json.loads(final.result or b"") == {"shipped": {"amount": 4}}

    # A JSON event that is not the shape is refused with a reason, its bytes kept.
    bad = json.dumps({"event_id": "x", "name": "payment_received", "amount": 1}).encode()
    record = h.produce(TopicName.EVENTS, run_id, bad, headers=event_headers())
    refusal = refused(h, record)
    assert refusal.reason == "malformed" and refusal.original_value == bad
