"""Pipelines with event waits (``Pipeline.await_event``), for the signal tests.

- ``paid``: ``prepare``, then the wait for ``payment_received`` correlated by the input's
  ``order`` (the index key ``order``) and ``region``, then ``ship`` gets the event payload.
- ``poked``: a wait for ``poke`` with no correlation; ``on_timeout="continue"``.
- ``instant``: a wait for ``never`` with a zero timeout: it only times out.
- ``graph_paid``: a graph: ``start``, then the wait for ``approved`` beside ``tally``;
  ``close`` joins both by name.
"""

from __future__ import annotations

from typing import Any

from processor.worker.pipeline import Application, Pipeline

__all__ = ["EVENT_TIMEOUT_S", "app"]

EVENT_TIMEOUT_S = 60.0

paid = Pipeline("paid")


@paid.step()
def prepare(order: dict[str, Any]) -> dict[str, Any]:
    return order


paid.await_event(
    "payment_received",
    timeout_s=EVENT_TIMEOUT_S,
    correlate=lambda order: {"order": order["order"], "region": order["region"]},
    key="order",
)


@paid.step()
def ship(payment: Any) -> dict[str, Any]:
    return {"shipped": payment}


poked = Pipeline("poked")
poked.await_event("poke", timeout_s=EVENT_TIMEOUT_S, on_timeout="continue")


@poked.step()
def after_poke(event: Any) -> dict[str, Any]:
    return {"poked": event}


instant = Pipeline("instant")
instant.await_event("never", timeout_s=0, on_timeout="continue")


@instant.step()
def after_never(event: Any) -> dict[str, Any]:
    return {"got": event}


graph_paid = Pipeline("graph_paid")


@graph_paid.step()
def start(value: dict[str, Any]) -> dict[str, Any]:
    return value


graph_paid.await_event(
    "approved",
    timeout_s=EVENT_TIMEOUT_S,
    correlate=lambda value: {"case": value["case"]},
    name="approval",
    needs=["start"],
)


@graph_paid.step(needs=["start"])
def tally(value: dict[str, Any]) -> int:
    return int(value["n"]) * 2


@graph_paid.step(needs=["approval", "tally"])
def close(both: dict[str, Any]) -> dict[str, Any]:
    return {"closed": both}


app = Application([paid, poked, instant, graph_paid])
