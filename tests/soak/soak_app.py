"""The chaos soak's application (``tests/soak/chaos.py``): one deployment, every shape.

- ``orders``: the standard workload (``processor.examples.demo``): three steps, one
  of them retried, an await answered by the responder process, a last step.
- ``fanned``: a graph with a fan-out of ``FAN_ITEMS`` items, at most ``FAN_LIMIT``
  in flight, one of them failing and tolerated, then a join and a finally step.
- ``branchy``: parallel branches with compensations, a caught failure, a route and a
  finally step; an input with ``"fail": true`` fails the run after both branches
  completed, so their compensations run in reverse order of completion.
- ``mend``: fails until its gate file exists (``tests.apps.control_pipelines``); the
  soak redrives the failed ones.
- ``waiter``: emits an event to ``SOAK_EMIT_TOPIC`` (``ctx.emit``), then waits for the
  event ``paid`` correlated by order number, which the soak sends by correlation key.
- ``parent``: starts ``KIDS`` child runs of ``kid``, at most two at once, and counts
  their results.
- ``ticker``: started by the soak's interval schedule.

Every step is deterministic in its input, so a redone step returns what it returned
before, whichever worker runs it.
"""

from __future__ import annotations

import os
from typing import Any

from processor.examples.demo import orders
from processor.model.pipeline_spec import RetryPolicy
from processor.worker.context import StepContext
from processor.worker.pipeline import Application, NonRetryableError, Pipeline
from tests.apps.control_pipelines import mend

__all__ = ["EMIT_TOPIC", "FAN_ITEMS", "FAN_LIMIT", "KIDS", "app"]

FAN_ITEMS = 8
FAN_LIMIT = 3
KIDS = 3
ONCE = RetryPolicy(max_attempts=1)
#: Where ``waiter`` emits; the soak names a topic of its own deployment.
EMIT_TOPIC = os.environ.get("SOAK_EMIT_TOPIC", "soak.emitted")

fanned = Pipeline("fanned")


@fanned.step()
def split(value: dict[str, Any]) -> list[int]:
    return [value["n"] * 10 + i for i in range(FAN_ITEMS)]


@fanned.fan_out(needs=["split"], max_in_flight=FAN_LIMIT, tolerate=1, retry=ONCE)
def square(item: int) -> int:
    if item % 10 == FAN_ITEMS - 1:
        raise NonRetryableError(f"item {item} is refused")
    return item * item


@fanned.step(needs=["square"])
def total(squares: dict[str, Any]) -> int:
    return sum(value for value in squares["items"] if value is not None)


@fanned.finally_step(needs=["total"])
def report(value: Any) -> str:
    return "reported"


branchy = Pipeline("branchy")


@branchy.step()
def open_order(value: dict[str, Any]) -> dict[str, Any]:
    return value


@branchy.step(needs=["open_order"])
def charge(value: dict[str, Any]) -> dict[str, Any]:
    return {"charged": value["n"]}


@branchy.compensate("charge")
def refund(charged: dict[str, Any]) -> dict[str, Any]:
    return {"refunded": charged["charged"]}


@branchy.step(needs=["open_order"])
def reserve(value: dict[str, Any]) -> dict[str, Any]:
    return {"reserved": value["n"]}


@branchy.compensate("reserve")
def release(reserved: dict[str, Any]) -> dict[str, Any]:
    return {"released": reserved["reserved"]}


@branchy.step(needs=["open_order"], catch="estimate", retry=ONCE)
def price(value: dict[str, Any]) -> int:
    raise NonRetryableError("the price service is down")


@branchy.step()
def estimate(error: dict[str, Any]) -> int:
    return 100


@branchy.step(needs=["charge", "reserve", "price"], routes=["ship", "hold"])
def decide(outputs: dict[str, Any]) -> str:
    return "ship" if outputs["charge"]["charged"] % 2 == 0 else "hold"


@branchy.step(needs=["decide"])
def ship(outputs: dict[str, Any]) -> str:
    if outputs["charge"]["charged"] % 3 == 0:
        raise NonRetryableError("the carrier refused the parcel")
    return "shipped"


@branchy.step(needs=["decide"])
def hold(outputs: dict[str, Any]) -> str:
    return "held"


@branchy.step(needs=["ship", "hold"], rule="none_failed")
def close(outputs: dict[str, Any]) -> str:
    return "closed"


@branchy.finally_step(needs=["close"])
def audit(value: Any) -> str:
    return "audited"


waiter = Pipeline("waiter", emits=[EMIT_TOPIC])


@waiter.step()
def announce(value: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    ctx.emit(EMIT_TOPIC, {"order": value["order"], "state": "awaiting payment"}, key=value["order"])
    return value


waiter.await_event(
    "paid", timeout_s=20, correlate=lambda value: {"order": value["order"]}, key="order"
)


@waiter.step()
def book(payment: Any) -> dict[str, Any]:
    return {"booked": payment}


parent = Pipeline("parent")


@parent.child("kid", timeout_s=60, itemized=True, max_in_flight=2)
def spawn(value: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"n": value["n"], "i": i} for i in range(KIDS)]


@parent.step()
def gather(results: list[Any]) -> int:
    return len(results)


kid = Pipeline("kid")


@kid.step()
def work(value: dict[str, Any]) -> int:
    return int(value["n"]) * 10 + int(value["i"])


ticker = Pipeline("ticker")


@ticker.step()
def tick(value: Any) -> Any:
    return value


app = Application([orders, fanned, branchy, mend, waiter, parent, kid, ticker])
