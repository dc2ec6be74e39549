"""Graph pipelines for the tests of graph runs in a ``processor`` process (issue 28);
load them with ``--app tests.apps.graph_pipelines:app``.

Every behaviour is chosen by the run input, so a process killed and restarted needs
no shared state. A ``gate`` in the input names a file: the step waits for it to exist
(up to ``GATE_WAIT_S``), so a test holds a step running while it cancels or kills; a
``began`` names a file the step creates first, so a test knows the step runs.

- ``parallel``: ``begin``, then ``charge`` and ``reserve`` at the same time (each
  waits at a barrier for the other: one after the other, the first would give up
  there and fail the run), then ``confirm`` joins them by name.
- ``handled``: ``fetch``, then ``price`` (``catch="fallback"``: it raises a
  NonRetryableError when the input says ``broken``) beside ``stock``, then ``quote``
  joins them: a caught failure's handler output reaches the join.
- ``routes``: the switch ``triage`` chooses the input's ``choose`` among ``refund``
  and ``reship`` (each waits for the input's ``gate``, if any), then ``close``
  (``none_failed``) joins what was selected, and the finally step ``audit`` runs.
- ``held``: ``slow_step`` waits for the input's ``gate``; ``never_reached`` needs it;
  the finally step ``release`` runs once every other step settled (after a cancel too).
- ``mixed``: the workload of the kill -9 test, everything a function of the input
  (``expected_mixed_result``): ``start``; ``left`` and ``right`` in parallel (each
  sleeps ``nap_ms``), ``right`` caught by ``patch`` when ``break`` is set; the switch
  ``pick`` after both routes to ``even`` or ``odd`` by ``n``; ``merge``
  (``none_failed``) joins the routes; the finally step ``tidy``.
- ``fanned``: ``listing`` passes on the input's ``items`` (each ``{"i", "bad",
  "nap_ms"}``, maybe with a ``gate``); the fan-out ``each`` maps them, at most
  ``FAN_LIMIT`` in flight, ``FAN_TOLERATE`` failed items tolerated (an item with
  ``bad`` raises a NonRetryableError); ``count`` gets its output
  (``expected_fanned_result``).
- ``answered``: ``ask``, then the await ``approve`` (target ``GRAPH_APPROVALS``,
  requesting ``{"n"}``) beside the step ``compute``; ``conclude`` joins both by name,
  and the finally step ``wrap`` runs.
- ``rules``: ``work`` (failing when the input says ``fail``), ``after_work`` and
  ``after_after`` after it (a failure skips both: two levels), the error branch
  ``on_failure`` (``one_failed``) and ``always_report`` (``all_done``).
- ``tolerant``: ``numbers`` lists ``range(n)`` (plus the input's ``more``); the fan-out
  ``square`` (``TOLERANT_LIMIT`` in flight, ``TOLERANT_PERCENT`` % of failed items
  tolerated) fails every item ending in 3; ``summarize`` gets its output.
- ``unwind``: ``open_order``, then ``book_a`` (held at the input's ``gate``) and
  ``book_b`` in parallel, then ``settle`` fails: the compensators of the three run.
- ``guarded``: ``notify_manager`` runs only for a ``total`` over 100 (``when``), and
  ``after_notify`` after it; ``finish`` (``none_failed``) joins.
- ``effects``: ``place``, then the effectful ``charge_card`` (held at the input's
  ``gate``, timed out after ``EFFECT_TIMEOUT_S``: Unknown) beside ``email``; ``receipt``
  joins both.
- ``redrivable``: ``start_order``, then ``bill`` beside ``stock_up`` (failing until the
  file the input names as ``fixed`` exists), then ``ship_it`` joins them.
- ``batched``: the itemized await ``print_labels`` (target ``GRAPH_LABELS``, one item
  per parcel, ``BATCH_LIMIT`` in flight, ``BATCH_TOLERATE`` failure tolerated), then
  ``labelled``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from processor.model.pipeline_spec import RetryPolicy
from processor.worker.pipeline import Application, NonRetryableError, Pipeline

__all__ = [
    "BATCH_LIMIT",
    "BATCH_TOLERATE",
    "EFFECT_TIMEOUT_S",
    "FAN_LIMIT",
    "FAN_TOLERATE",
    "GATE_WAIT_S",
    "GRAPH_APPROVALS",
    "GRAPH_LABELS",
    "TOLERANT_LIMIT",
    "TOLERANT_PERCENT",
    "app",
    "expected_answered_result",
    "expected_fanned_result",
    "expected_mixed_result",
]

ONCE = RetryPolicy(max_attempts=1)
#: How long a gated step waits for its gate file (then it goes on anyway).
GATE_WAIT_S = 30.0


def _wait_for_gate(value: dict[str, Any]) -> None:
    began = value.get("began")
    if began is not None:
        Path(began).touch()  # the step runs: a stop notice now cannot keep it from running
    gate = value.get("gate")
    if gate is None:
        return
    deadline = time.monotonic() + GATE_WAIT_S
    while not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.02)


# --- parallel -------------------------------------------------------------------------------

_both_in = threading.Barrier(2, timeout=20)
parallel = Pipeline("parallel")


@parallel.step()
def begin(order: dict[str, Any]) -> dict[str, Any]:
    return order


@parallel.step(needs=["begin"], retry=ONCE)
def charge(order: dict[str, Any]) -> dict[str, Any]:
    _both_in.wait()  # returns only while reserve runs too
    return {"charged": order["total"]}


@parallel.step(needs=["begin"], retry=ONCE)
def reserve(order: dict[str, Any]) -> dict[str, Any]:
    _both_in.wait()
    return {"reserved": order["items"]}


@parallel.step(needs=["charge", "reserve"])
def confirm(outputs: dict[str, Any]) -> dict[str, Any]:
    return {"confirmed": outputs}


# --- handled --------------------------------------------------------------------------------

handled = Pipeline("handled")


@handled.step()
def fetch(value: dict[str, Any]) -> dict[str, Any]:
    return value


@handled.step(needs=["fetch"], catch="fallback", retry=ONCE)
def price(value: dict[str, Any]) -> dict[str, Any]:
    if value.get("broken"):
        raise NonRetryableError(f"no price for {value['sku']}")
    return {"price": 10}


@handled.step()
def fallback(error: dict[str, Any]) -> dict[str, Any]:
    return {"price": 0, "because": error}


@handled.step(needs=["fetch"])
def stock(value: dict[str, Any]) -> dict[str, Any]:
    return {"in_stock": value["sku"]}


@handled.step(needs=["price", "stock"])
def quote(outputs: dict[str, Any]) -> dict[str, Any]:
    return {"quote": outputs}


# --- routes ---------------------------------------------------------------------------------

routes = Pipeline("routes")


@routes.step(routes=["refund", "reship"])
def triage(claim: dict[str, Any]) -> Any:
    return claim["choose"]


@routes.step(needs=["triage"], timeout_s=GATE_WAIT_S + 10)
def refund(claim: dict[str, Any]) -> dict[str, Any]:
    _wait_for_gate(claim)
    return {"refunded": claim["amount"]}


@routes.step(needs=["triage"], timeout_s=GATE_WAIT_S + 10)
def reship(claim: dict[str, Any]) -> dict[str, Any]:
    _wait_for_gate(claim)
    return {"reshipped": claim["amount"]}


@routes.step(needs=["refund", "reship"], rule="none_failed")
def close(outputs: dict[str, Any]) -> dict[str, Any]:
    return outputs


@routes.finally_step(needs=["close"])
def audit(outputs: Any) -> str:
    return "audited"


# --- held -----------------------------------------------------------------------------------

held = Pipeline("held")


@held.step(timeout_s=GATE_WAIT_S + 10)
def slow_step(value: dict[str, Any]) -> dict[str, Any]:
    _wait_for_gate(value)
    return value


@held.step(needs=["slow_step"])
def never_reached(value: Any) -> Any:
    return value


@held.finally_step()
def release(value: Any) -> str:
    return "released"


# --- mixed (the kill -9 workload) -----------------------------------------------------------

mixed = Pipeline("mixed")


def _nap(value: dict[str, Any]) -> None:
    time.sleep(value.get("nap_ms", 0) / 1000)


@mixed.step()
def start(value: dict[str, Any]) -> dict[str, Any]:
    return value


@mixed.step(needs=["start"])
def left(value: dict[str, Any]) -> int:
    _nap(value)
    return int(value["n"]) * 2


@mixed.step(needs=["start"], catch="patch", retry=ONCE)
def right(value: dict[str, Any]) -> int:
    _nap(value)
    if value.get("break"):
        raise NonRetryableError("right broke")
    return int(value["n"]) + 1


@mixed.step()
def patch(error: dict[str, Any]) -> int:
    return -1


@mixed.step(needs=["left", "right"], routes=["even", "odd"])
def pick(both: dict[str, Any]) -> str:
    return "even" if both["left"] % 4 == 0 else "odd"


@mixed.step(needs=["pick"])
def even(both: dict[str, Any]) -> dict[str, Any]:
    return {"even": both}


@mixed.step(needs=["pick"])
def odd(both: dict[str, Any]) -> dict[str, Any]:
    return {"odd": both}


@mixed.step(needs=["even", "odd"], rule="none_failed")
def merge(routes: dict[str, Any]) -> dict[str, Any]:
    return {"merged": routes}


@mixed.finally_step(needs=["merge"])
def tidy(value: Any) -> str:
    return "tidied"


def expected_mixed_result(value: dict[str, Any]) -> dict[str, Any]:
    """The result of a ``mixed`` run of input ``value`` (``merge``'s output)."""
    n = int(value["n"])
    both = {"left": n * 2, "right": -1 if value.get("break") else n + 1}
    chosen = "even" if both["left"] % 4 == 0 else "odd"
    taken = {"even": None, "odd": None} | {chosen: {chosen: both}}
    return {"merged": taken}


# --- fanned: a fan-out under a limit and a tolerance ---------------------------------------

#: The ``fanned`` fan-out's limit and tolerance (a count of failed items).
FAN_LIMIT = 5
FAN_TOLERATE = 3
fanned = Pipeline("fanned")


@fanned.step()
def listing(value: dict[str, Any]) -> Any:
    return value["items"]


@fanned.fan_out(
    needs=["listing"],
    max_in_flight=FAN_LIMIT,
    tolerate=FAN_TOLERATE,
    retry=ONCE,
    timeout_s=GATE_WAIT_S + 10,
)
def each(item: dict[str, Any]) -> int:
    _nap(item)
    _wait_for_gate(item)
    if item.get("bad"):
        raise NonRetryableError(f"item {item['i']} is bad")
    return int(item["i"]) ** 2


@fanned.step(needs=["each"])
def count(output: dict[str, Any]) -> dict[str, Any]:
    return {"squares": output["items"], "failed": [f["item"] for f in output["failed"]]}


def expected_fanned_result(value: dict[str, Any]) -> dict[str, Any] | None:
    """The result of a ``fanned`` run of input ``value``; None: the run fails."""
    items = value["items"]
    bad = [i for i, item in enumerate(items) if item.get("bad")]
    if len(bad) > FAN_TOLERATE:
        return None
    squares = [None if item.get("bad") else int(item["i"]) ** 2 for item in items]
    return {"squares": squares, "failed": bad}


# --- answered: an await in a graph, beside a step ----------------------------------------

#: The target of ``answered``'s await (a test's responder answers it).
GRAPH_APPROVALS = "graph-approvals"
answered = Pipeline("answered")


@answered.step()
def ask(value: dict[str, Any]) -> dict[str, Any]:
    return value


@answered.await_step(needs=["ask"], target=GRAPH_APPROVALS, timeout_s=600)
def approve(value: dict[str, Any]) -> dict[str, Any]:
    return {"n": value["n"]}


@answered.step(needs=["ask"])
def compute(value: dict[str, Any]) -> int:
    _nap(value)
    return int(value["n"]) * 10


@answered.step(needs=["approve", "compute"])
def conclude(both: dict[str, Any]) -> dict[str, Any]:
    return {"concluded": both}


@answered.finally_step(needs=["conclude"])
def wrap(value: Any) -> str:
    return "wrapped"


def expected_answered_result(value: dict[str, Any], answer: Any) -> dict[str, Any]:
    """The result of an ``answered`` run of input ``value`` whose await got ``answer``."""
    return {"concluded": {"approve": answer, "compute": int(value["n"]) * 10}}


# --- rules: a failure's skip through two levels, and its error branches ----------------------

rules = Pipeline("rules")


@rules.step(retry=ONCE)
def work(value: dict[str, Any]) -> dict[str, Any]:
    if value.get("fail"):
        raise NonRetryableError("work failed")
    return {"worked": True}


@rules.step(needs=["work"])
def after_work(value: dict[str, Any]) -> dict[str, Any]:
    return value


@rules.step(needs=["after_work"])
def after_after(value: dict[str, Any]) -> dict[str, Any]:
    return value


@rules.step(needs=["work"], rule="one_failed")
def on_failure(value: Any) -> str:
    return "alerted"


@rules.step(needs=["work"], rule="all_done")
def always_report(value: Any) -> str:
    return "reported"


# --- tolerant: a fan-out under a percentage tolerance --------------------------------------

#: ``tolerant``'s fan-out: its limit and its tolerance (a percentage, inclusive).
TOLERANT_LIMIT = 5
TOLERANT_PERCENT = 10
tolerant = Pipeline("tolerant")


@tolerant.step()
def numbers(value: dict[str, Any]) -> Any:
    return list(range(value["n"])) + value.get("more", [])


@tolerant.fan_out(
    needs=["numbers"],
    max_in_flight=TOLERANT_LIMIT,
    tolerate_percent=TOLERANT_PERCENT,
    retry=ONCE,
)
def square(item: int) -> int:
    if item % 10 == 3:
        raise NonRetryableError(f"bad item {item}")
    return item * item


@tolerant.step(needs=["square"])
def summarize(output: dict[str, Any]) -> dict[str, Any]:
    return output


# --- unwind: compensation across branches ---------------------------------------------------

unwind = Pipeline("unwind")


@unwind.step()
def open_order(value: dict[str, Any]) -> dict[str, Any]:
    return value


@unwind.step(needs=["open_order"])
def book_a(value: dict[str, Any]) -> str:
    _wait_for_gate(value)  # held until book_b completed: the order of completion is b, a
    return "a"


@unwind.step(needs=["open_order"])
def book_b(value: dict[str, Any]) -> str:
    return "b"


@unwind.step(needs=["book_a", "book_b"], retry=ONCE)
def settle(value: Any) -> Any:
    raise NonRetryableError("settlement refused")


def _undo(value: Any) -> None:
    return None


for _name in ("open_order", "book_a", "book_b"):
    unwind.compensate(_name)(_undo)


# --- guarded: a predicate -------------------------------------------------------------------

guarded = Pipeline("guarded")


@guarded.step()
def receive(order: dict[str, Any]) -> dict[str, Any]:
    return order


@guarded.step(needs=["receive"], when=lambda order: order["total"] > 100)
def notify_manager(order: dict[str, Any]) -> str:
    return "notified"


@guarded.step(needs=["notify_manager"])
def after_notify(value: Any) -> Any:
    return value


@guarded.step(needs=["receive", "notify_manager"], rule="none_failed")
def finish(outputs: dict[str, Any]) -> dict[str, Any]:
    return outputs


# --- effects: an effectful step whose outcome becomes Unknown --------------------------------

#: ``charge_card``'s attempt timeout: it waits for its gate longer, so it turns Unknown.
EFFECT_TIMEOUT_S = 1.0
effects = Pipeline("effects")


@effects.step()
def place(order: dict[str, Any]) -> dict[str, Any]:
    return order


@effects.step(needs=["place"], effectful=True, timeout_s=EFFECT_TIMEOUT_S)
def charge_card(order: dict[str, Any]) -> dict[str, Any]:
    _wait_for_gate(order)  # the worker hangs: its outcome becomes Unknown
    return {"charged": order["total"]}


@effects.step(needs=["place"])
def email(order: dict[str, Any]) -> str:
    return "sent"


@effects.step(needs=["charge_card", "email"])
def receipt(outputs: dict[str, Any]) -> dict[str, Any]:
    return outputs


# --- redrivable: a failed branch, redriven once its cause is gone ----------------------------

redrivable = Pipeline("redrivable")


@redrivable.step()
def start_order(order: dict[str, Any]) -> dict[str, Any]:
    return order


@redrivable.step(needs=["start_order"])
def bill(order: dict[str, Any]) -> dict[str, Any]:
    return {"billed": True}


@redrivable.step(needs=["start_order"], retry=ONCE)
def stock_up(order: dict[str, Any]) -> dict[str, Any]:
    if not Path(order["fixed"]).exists():
        raise NonRetryableError("warehouse offline")
    return {"stocked": True}


@redrivable.step(needs=["bill", "stock_up"])
def ship_it(outputs: dict[str, Any]) -> dict[str, Any]:
    return outputs


# --- batched: an itemized await under a limit and a tolerance --------------------------------

#: ``batched``'s await: its target, its limit in flight and its tolerance (failed items).
GRAPH_LABELS = "graph-labels"
BATCH_LIMIT = 3
BATCH_TOLERATE = 1
batched = Pipeline("batched")


@batched.await_step(
    target=GRAPH_LABELS,
    timeout_s=600,
    itemized=True,
    max_in_flight=BATCH_LIMIT,
    tolerate=BATCH_TOLERATE,
)
def print_labels(order: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"parcel": parcel} for parcel in range(order["parcels"])]


@batched.step()
def labelled(outputs: dict[str, Any]) -> dict[str, Any]:
    return outputs


app = Application(
    [
        parallel,
        handled,
        routes,
        held,
        mixed,
        fanned,
        answered,
        rules,
        tolerant,
        unwind,
        guarded,
        effects,
        redrivable,
        batched,
    ]
)
