"""Emission's pure parts: derived event ids, what a worker's attempt carries, declarations."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.config.settings import Settings
from processor.errors import ConfigurationError
from processor.facts.models import WorkItem
from processor.model.emission import event_id
from processor.worker.context import StepContext
from processor.worker.executor import execute
from processor.worker.pipeline import Application, Pipeline

names = st.text(min_size=1, max_size=20)
small = st.integers(min_value=0, max_value=1000)


@given(names, small, small, small)
def test_an_event_id_is_a_function_of_run_segment_step_and_index(
    run_id: str, segment: int, step: int, index: int
) -> None:
    eid = event_id(run_id, segment, step, index)
    assert eid == event_id(run_id, segment, step, index)
    assert len(eid) == 32 and int(eid, 16) >= 0
    others = {
        event_id(run_id + "x", segment, step, index),
        event_id(run_id, segment + 1, step, index),
        event_id(run_id, segment, step + 1, index),
        event_id(run_id, segment, step, index + 1),
    }
    assert eid not in others and len(others) == 4


def test_run_ids_that_share_a_prefix_do_not_share_ids() -> None:
    assert event_id("a|1", 2, 3, 4) != event_id("a", 1, 2, 3)  # length-prefixed run id


def _app() -> Application:
    pipeline = Pipeline("p", emits=["t"])

    @pipeline.step()
    def first(value: Any, ctx: StepContext) -> Any:
        ctx.emit("t", {"first": value}, key="k")
        return value

    @pipeline.step()
    def second(value: Any, ctx: StepContext) -> Any:
        ctx.emit("t", {"second": value})
        if value == "fail":
            raise RuntimeError("after emitting")
        return value

    return Application([pipeline])


def _item(value: bytes) -> WorkItem:
    return WorkItem(
        run_id="r",
        pipeline="p",
        pipeline_version=1,
        segment=1,
        attempt=1,
        generation=1,
        first_step=0,
        input=value,
        expires_ms=2**62,
    )


def test_an_attempt_carries_the_events_of_the_steps_that_returned() -> None:
    result = execute(_item(b'"ok"'), _app(), "w")
    assert result.outcome == "completed"
    assert [(e.step, e.topic, e.key, e.value) for e in result.emits] == [
        (0, "t", "k", b'{"first":"ok"}'),
        (1, "t", None, b'{"second":"ok"}'),
    ]


def test_a_step_that_raises_loses_its_events_but_not_the_earlier_steps() -> None:
    result = execute(_item(b'"fail"'), _app(), "w")
    assert (result.outcome, result.failed_step) == ("failed", 1)
    assert [e.step for e in result.emits] == [0]


def test_a_value_that_is_not_json_fails_the_step() -> None:
    pipeline = Pipeline("p", emits=["t"])

    @pipeline.step()
    def bad(value: Any, ctx: StepContext) -> Any:
        ctx.emit("t", {1, 2})
        return value

    result = execute(_item(b"1"), Application([pipeline]), "w")
    assert (result.outcome, result.error_type, result.retryable) == (
        "failed",
        "InvalidPayloadError",
        False,
    )
    assert result.emits == ()


def test_emit_topics_are_checked_where_they_are_declared() -> None:
    with pytest.raises(ConfigurationError, match="not a valid topic name"):
        Pipeline("bad", emits=["no spaces allowed"])
    with pytest.raises(ConfigurationError, match="a list of topic names"):
        Pipeline("bad", emits="one.string")
    assert Application([_declared("b.x", "a.y")]).output_topics == ["a.y", "b.x"]


def _declared(*topics: str) -> Pipeline:
    pipeline = Pipeline("declared", emits=topics)
    pipeline.step()(lambda value: value)
    return pipeline


def test_settings_declare_topics_for_every_pipeline() -> None:
    settings = Settings(emit_topics=" audit.events, billing ,,audit.events")
    assert settings.declared_emit_topics == ("audit.events", "billing")
    assert Settings().declared_emit_topics == ()
