"""Pipelines with boundaries, for the admission and continuation tests."""

from __future__ import annotations

from typing import Any

from processor.model.pipeline_spec import CheckpointSpec, RetryPolicy
from processor.worker.pipeline import Application, Pipeline

AWAIT_TIMEOUT_S = 60.0
PUBLISHED_TOPIC = "test.published"

scalar = Pipeline("scalar")


@scalar.step()
def prepare(value: dict[str, Any]) -> dict[str, Any]:
    return {"n": value["n"], "prepared": True}


@scalar.await_step(target="echo", timeout_s=AWAIT_TIMEOUT_S)
def ask(value: dict[str, Any]) -> dict[str, Any]:
    return {"question": value["n"]}


@scalar.step()
def finish(answer: Any) -> dict[str, Any]:
    return {"answer": answer}


itemized = Pipeline("itemized")


@itemized.await_step(target="square", timeout_s=AWAIT_TIMEOUT_S, itemized=True)
def fan_out(value: dict[str, Any]) -> list[dict[str, int]]:
    return [{"i": i} for i in range(value["items"])]


@itemized.step()
def gather(outputs: list[Any]) -> dict[str, Any]:
    return {"outputs": outputs}


tolerant = Pipeline("tolerant")


@tolerant.await_step(target="slow", timeout_s=AWAIT_TIMEOUT_S, on_timeout="continue")
def ask_slowly(value: Any) -> dict[str, Any]:
    return {"q": value}


@tolerant.step()
def handle(answer: Any) -> dict[str, Any]:
    return {"handled": answer}


source = Pipeline("source", checkpoint=CheckpointSpec("order-ready", "pipeline:sink"))


@source.step()
def make_order(value: dict[str, Any]) -> dict[str, Any]:
    return {"order": value["order"], "ready": True}


sink = Pipeline("sink")


@sink.step()
def receive(order: dict[str, Any]) -> dict[str, Any]:
    return {"received": order}


waiter = Pipeline("waiter")


@waiter.step()
def get_ready(value: Any) -> dict[str, Any]:
    return {"waiting_for": "go", "input": value}


waiter.await_checkpoint("go", timeout_s=AWAIT_TIMEOUT_S)


@waiter.step()
def proceed(handoff: Any) -> dict[str, Any]:
    return {"proceeded_with": handoff}


publisher = Pipeline("publisher", output_topic=PUBLISHED_TOPIC)


@publisher.step(retry=RetryPolicy(max_attempts=1))
def produce_result(value: Any) -> dict[str, Any]:
    return {"published": value}


# A target that speaks the JSON shape (processor/facts/json_wire.py, docs/CONTRACT.md).
json_scalar = Pipeline("json_scalar")


@json_scalar.await_step(target="json-echo", timeout_s=AWAIT_TIMEOUT_S, wire="json")
def ask_in_json(value: dict[str, Any]) -> dict[str, Any]:
    return {"question": value["n"]}


@json_scalar.step()
def finish_json(answer: Any) -> dict[str, Any]:
    return {"answer": answer}


json_itemized = Pipeline("json_itemized")


@json_itemized.await_step(
    target="json-square", timeout_s=AWAIT_TIMEOUT_S, itemized=True, wire="json"
)
def fan_out_in_json(value: dict[str, Any]) -> list[dict[str, int]]:
    return [{"i": i} for i in range(value["items"])]


@json_itemized.step()
def gather_json(outputs: list[Any]) -> dict[str, Any]:
    return {"outputs": outputs}


app = Application(
    [scalar, itemized, tolerant, source, sink, waiter, publisher, json_scalar, json_itemized]
)
