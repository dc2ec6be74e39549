"""The bundled example: an order pipeline with a flaky step and a payment await.

``reserve_stock`` fails the first time it sees one order in five, as an
inventory service under load would; its retry policy absorbs the failure.
``capture_payment`` suspends the run until the payment system (simulated by
``payments_simulator`` in the demo) completes the capture through
boundary.completions; ``invoice`` receives the capture result.
"""

from __future__ import annotations

import threading
import zlib
from typing import Any

from processor.model.pipeline_spec import RetryPolicy
from processor.worker.pipeline import Application, NonRetryableError, Pipeline

__all__ = ["app", "orders"]

orders = Pipeline("orders", version=1)

_failed_once: set[str] = set()
_lock = threading.Lock()


class InventoryBusyError(RuntimeError):
    """A transient failure: the inventory service asked us to come back later."""


@orders.step(timeout_s=10)
def validate(order: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(order, dict) or "order_id" not in order:
        raise NonRetryableError("an order needs an order_id")
    if float(order.get("amount", 0)) <= 0:
        raise NonRetryableError(f"order {order['order_id']}: amount must be positive")
    return {**order, "amount": float(order["amount"])}


@orders.step(retry=RetryPolicy(max_attempts=4, initial_backoff_ms=20, max_backoff_ms=500))
def reserve_stock(order: dict[str, Any]) -> dict[str, Any]:
    order_id = str(order["order_id"])
    if zlib.crc32(order_id.encode()) % 5 == 0:
        with _lock:  # remembered only until the retry: memory stays flat over many runs
            first_time = order_id not in _failed_once
            if first_time:
                _failed_once.add(order_id)
            else:
                _failed_once.discard(order_id)
        if first_time:
            raise InventoryBusyError(f"inventory busy for order {order_id}")
    return {**order, "reserved": True}


@orders.await_step(target="payments", timeout_s=30)
def capture_payment(order: dict[str, Any]) -> dict[str, Any]:
    """The request for the payment system: capture the order's total."""
    return {"order_id": order["order_id"], "amount": round(order["amount"] * 1.2, 2)}


@orders.step()
def invoice(capture: dict[str, Any]) -> dict[str, Any]:
    return {
        "order_id": capture["order_id"],
        "total": capture["amount"],
        "payment_id": capture["payment_id"],
        "status": "invoiced",
    }


def payments_simulator(request: Any, body: dict[str, Any]) -> dict[str, Any]:
    """What the external payment system answers: a captured payment."""
    return {**body, "payment_id": f"pay-{request.run_id[:8]}", "captured": True}


app = Application([orders])
