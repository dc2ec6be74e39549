"""The pure rules of event waits (model/event_waits.py, admission/signals.py): the
subset match, the registration, which wait an event settles, duplicates by event id,
the runs index rows by key, and the decoding of events."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from processor.admission.arrivals import Arrival, Refusal
from processor.admission.signals import KeyedEvent, event_arrival
from processor.facts.codec import encode
from processor.facts.models import SignalEvent
from processor.model import event_waits
from processor.model.listing import index_entries
from processor.model.pipeline_spec import AwaitSpec
from processor.model.state import Interaction, RunState

fields = st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=4)


@given(fields, fields)
@settings(deadline=None)  # pure and fast; a loaded machine must not fail it
def test_an_event_matches_a_wait_when_it_carries_each_declared_field(
    wanted: dict[str, str], extra: dict[str, str]
) -> None:
    assert event_waits.matches(wanted, {**extra, **wanted})
    assert event_waits.matches({}, extra)


@given(fields.filter(bool), st.data())
@settings(deadline=None)  # pure and fast; a loaded machine must not fail it
def test_a_missing_or_different_field_does_not_match(
    wanted: dict[str, str], data: st.DataObject
) -> None:
    field = data.draw(st.sampled_from(sorted(wanted)))
    missing = {k: v for k, v in wanted.items() if k != field}
    assert not event_waits.matches(wanted, missing)
    assert not event_waits.matches(wanted, {**wanted, field: wanted[field] + "x"})


@given(st.text(min_size=1), fields, st.none() | st.text())
@settings(deadline=None)  # pure and fast; a loaded machine must not fail it
def test_a_registration_round_trips_through_its_target(
    event: str, correlation: dict[str, str], key: str | None
) -> None:
    target = event_waits.registration_target(event, correlation, key)
    parsed = event_waits.parse_registration(target)
    assert parsed == event_waits.Registration(event, correlation, key)
    assert event_waits.parse_registration("echo") is None
    assert event_waits.parse_registration("{not json") is None


def test_a_correlation_must_be_an_object_of_strings_with_the_key() -> None:
    assert event_waits.correlation_problem(b'{"order": "1"}', "order") == ""
    assert event_waits.correlation_problem(b"{}", None) == ""
    assert "object of strings" in event_waits.correlation_problem(b'{"order": 1}', None)
    assert "object of strings" in event_waits.correlation_problem(b"[]", None)
    assert "no field 'order'" in event_waits.correlation_problem(b'{"id": "1"}', "order")
    assert "one correlation" in event_waits.suspension_problem([], None)


def test_an_await_keeps_its_target_and_an_event_wait_registers() -> None:
    plain = AwaitSpec("payments", 1000)
    assert event_waits.target_of(plain, b'{"x": 1}') == "payments"
    waits_for = AwaitSpec("paid", 1000, kind="event", event_key="order")
    target = event_waits.target_of(waits_for, b'{"order":"7"}')
    assert event_waits.parse_registration(target) == event_waits.Registration(
        "paid", {"order": "7"}, "order"
    )


def _wait(
    boundary: int, correlation: dict[str, str], key: str | None = None, **kw: object
) -> Interaction:
    target = event_waits.registration_target("paid", correlation, key)
    fields = {
        "boundary": boundary,
        "item_index": 0,
        "kind": "event",
        "target": target,
        "deadline_ms": 10_000,
        "token_digest": b"",
        **kw,
    }
    return Interaction.model_validate(fields)


def _state(**interactions: Interaction) -> RunState:
    return RunState.model_validate(
        {
            "run_id": "r",
            "pipeline": "p",
            "pipeline_version": 1,
            "input": b"",
            "submitted_ms": 0,
            "created_ms": 0,
            "updated_ms": 0,
            "submit_command_id": "c",
            "last_output": b"",
            "phase": "suspended",
            "boundary": {"number": 1, "kind": "event", "items": 1},
            "interactions": interactions,
        }
    )


def test_an_event_settles_the_oldest_open_wait_it_matches() -> None:
    state = _state(
        b2=_wait(2, {"order": "1"}),
        b1=_wait(1, {"order": "1", "region": "eu"}),
        b0=_wait(0, {"order": "2"}),
    )
    assert event_waits.find_open(state, "paid", {"order": "1", "region": "eu"})[0] == "b1"  # type: ignore[index]
    assert event_waits.find_open(state, "paid", {"order": "1"})[0] == "b2"  # type: ignore[index]
    assert event_waits.find_open(state, "paid", {"order": "3"}) is None
    assert event_waits.find_open(state, "refunded", {"order": "1"}) is None


def test_an_event_by_key_settles_only_waits_keyed_by_it() -> None:
    state = _state(
        keyed=_wait(1, {"order": "1", "region": "eu"}, "order"),
        unkeyed=_wait(0, {"order": "1"}),
    )
    found = event_waits.find_open(state, "paid", {"region": "eu"}, key="1")
    assert found is not None and found[0] == "keyed"
    assert event_waits.find_open(state, "paid", {"region": "us"}, key="1") is None
    assert event_waits.find_open(state, "paid", {"region": "eu"}, key="2") is None


def test_the_same_event_id_is_found_admitted_whatever_its_payload() -> None:
    digest = event_waits.event_digest("paid", "evt-1")
    state = _state(b1=_wait(1, {}, status="admitted", digest=digest))
    assert event_waits.find_admitted(state, "paid", digest) is not None
    assert (
        event_waits.find_admitted(state, "paid", event_waits.event_digest("paid", "evt-2")) is None
    )
    assert event_waits.event_digest("paid", "evt-1") != event_waits.event_digest("paidevt", "-1")


def test_status_shows_the_event_its_correlation_key_and_deadline() -> None:
    shown = event_waits.shown([_wait(1, {"order": "1"}, "order")])
    assert shown == {
        "event": {
            "name": "paid",
            "correlation": {"order": "1"},
            "key": "1",
            "deadline_ms": 10_000,
            "status": "open",
        }
    }
    assert event_waits.shown([]) == {}


def test_a_run_waiting_by_key_has_an_index_row_by_event_and_key() -> None:
    state = _state(k=_wait(1, {"order": "1"}, "order"), u=_wait(1, {"order": "2"}))
    rows = {(e.kind, e.parts) for e in index_entries(state) if e.kind == "event_key"}
    assert rows == {("event_key", ("paid", "1"))}
    # Listed (and counted in the metrics) by the event's name, never by its correlation.
    waiting = {e.parts for e in index_entries(state) if e.kind == "waiting"}
    assert waiting == {("event:paid",)}
    done = state.model_copy(update={"status": "succeeded"})
    assert not any(e.kind == "event_key" for e in index_entries(done))
    assert event_waits.keyed(
        [
            event_waits.registration_target("paid", {"order": "1"}, "order"),
            event_waits.registration_target("paid", {"order": "2"}, None),
            "payments",
        ]
    ) == {("paid", "1")}


def test_events_decode_to_arrivals_by_run_or_by_key_and_bad_ones_are_refused() -> None:
    by_run = SignalEvent(event_id="e", name="paid", run_id="r", payload=b' {"a": 1}')
    arrival = event_arrival(encode(by_run), "c")
    assert isinstance(arrival, Arrival)
    assert (arrival.run_id, arrival.event, arrival.payload) == ("r", "paid", b'{"a":1}')
    by_key = SignalEvent(event_id="e", name="paid", correlation_key="7", payload=b"1")
    keyed = event_arrival(encode(by_key), "c")
    assert isinstance(keyed, KeyedEvent) and keyed.arrival("r").key == "7"
    for bad in (
        SignalEvent(event_id="", name="paid", run_id="r", payload=b"1"),
        SignalEvent(event_id="e", name="paid", payload=b"1"),
        SignalEvent(event_id="e", name="paid", run_id="r", correlation_key="7", payload=b"1"),
        SignalEvent(event_id="e", name="paid", run_id="r", payload=b"{bad"),
    ):
        refusal = event_arrival(encode(bad), "c")
        assert isinstance(refusal, Refusal) and refusal.reason == "malformed", bad
    assert json.loads(arrival.payload) == {"a": 1}
