"""The pipelines of the HTTP tests: the demo's orders (an await on ``payments``), one
that always fails (a dead letter), and ``fulfil``, a graph with parallel branches, a
switch, a catch handler and a fan-out (the run inspector's graph)."""

from __future__ import annotations

from typing import Any

from processor.examples.demo import orders
from processor.model.pipeline_spec import RetryPolicy
from processor.worker.pipeline import Application, NonRetryableError, Pipeline
from tests.apps.pipelines import non_retryable

ONCE = RetryPolicy(max_attempts=1)
#: An order's lines unless it names its own: one is discontinued (a failed item).
LINES = (
    {"sku": "tea", "qty": 2},
    {"sku": "mug", "qty": 1},
    {"sku": "kettle", "qty": 1, "discontinued": True},
)

#: begin -> (charge, reserve [caught by backorder]) -> choose -> ship | pickup -> confirm,
#: begin -> lines -> price (a fan-out over the lines, 2 at a time, one failed item
#: tolerated) -> confirm, and release, a finally step.
#: ``{"out_of_stock": true}`` fails reserve (then caught);
#: ``{"pickup": true}`` takes the pickup route (else ship); ``{"declined": true}`` fails
#: charge, which has no handler: the run fails, choose and its routes are skipped.
fulfil = Pipeline("fulfil")


@fulfil.step()
def begin(order: dict[str, Any]) -> dict[str, Any]:
    return order


@fulfil.step(needs=["begin"], retry=ONCE)
def charge(order: dict[str, Any]) -> dict[str, Any]:
    if order.get("declined"):
        raise NonRetryableError("card declined")
    return {"charged": order.get("total", 0), "pickup": bool(order.get("pickup"))}


@fulfil.step(needs=["begin"], retry=ONCE, catch="backorder")
def reserve(order: dict[str, Any]) -> dict[str, Any]:
    if order.get("out_of_stock"):
        raise NonRetryableError("no stock left")
    return {"reserved": order.get("items", 1)}


@fulfil.step()
def backorder(error: dict[str, Any]) -> dict[str, Any]:
    return {"backordered": True, "because": error["message"]}


@fulfil.step(needs=["charge", "reserve"], routes=["ship", "pickup"])
def choose(outputs: dict[str, Any]) -> str:
    return "pickup" if outputs["charge"]["pickup"] else "ship"


@fulfil.step(needs=["choose"])
def ship(outputs: dict[str, Any]) -> dict[str, Any]:
    return {"shipped": True}


@fulfil.step(needs=["choose"])
def pickup(outputs: dict[str, Any]) -> dict[str, Any]:
    return {"pickup": "store 4"}


@fulfil.step(needs=["begin"])
def lines(order: dict[str, Any]) -> list[dict[str, Any]]:
    return list(order.get("lines", LINES))


@fulfil.fan_out(needs=["lines"], max_in_flight=2, tolerate=1, retry=ONCE)
def price(line: dict[str, Any]) -> float:
    if line.get("discontinued"):
        raise NonRetryableError(f"{line['sku']} is discontinued")
    return float(line["qty"]) * 2.5


@fulfil.step(needs=["ship", "pickup", "price"], rule="none_failed")
def confirm(outputs: dict[str, Any]) -> dict[str, Any]:
    return {"confirmed": outputs}


@fulfil.finally_step(needs=["confirm"])
def release(outputs: Any) -> str:
    return "released"


app = Application([orders, non_retryable, fulfil])
