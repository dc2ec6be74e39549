"""The pipelines of the HTTP tests: the demo's orders (an await on ``payments``), one
that always fails (a dead letter), and ``fulfil``, a graph with parallel branches, a
switch and a catch handler (the run inspector's graph)."""

from __future__ import annotations

from typing import Any

from processor.examples.demo import orders
from processor.model.pipeline_spec import RetryPolicy
from processor.worker.pipeline import Application, NonRetryableError, Pipeline
from tests.apps.pipelines import non_retryable

ONCE = RetryPolicy(max_attempts=1)

#: begin -> (charge, reserve [caught by backorder]) -> choose -> ship | pickup -> confirm,
#: and release, a finally step. ``{"out_of_stock": true}`` fails reserve (then caught);
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


@fulfil.step(needs=["ship", "pickup"], rule="none_failed")
def confirm(outputs: dict[str, Any]) -> dict[str, Any]:
    return {"confirmed": outputs}


@fulfil.finally_step(needs=["confirm"])
def release(outputs: Any) -> str:
    return "released"


app = Application([orders, non_retryable, fulfil])
