"""An itemized await under a limit, and how a test answers it (``LocalEnvironment``).

- ``batched``: ``print_labels`` asks the target ``labels`` for one label per parcel
  of the input's ``parcels``, at most 3 in flight, one failed item tolerated;
  ``labelled`` gets what came back.
"""

from __future__ import annotations

from typing import Any

from processor import LocalEnvironment
from processor.facts.models import BoundaryCompletionAdmitted
from processor.worker.pipeline import Pipeline

batched = Pipeline("batched")


@batched.await_step(target="labels", timeout_s=600, itemized=True, max_in_flight=3, tolerate=1)
def print_labels(order: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"parcel": parcel} for parcel in range(order["parcels"])]


@batched.step()
def labelled(outputs: dict[str, Any]) -> dict[str, Any]:
    return outputs


def answer_all(env: LocalEnvironment, run_id: str, failing: set[int]) -> int:
    """Answer the run's requests as they open, lowest item first, failing the items in
    ``failing``, until the run ended; the most requests open at once."""
    most = answered = 0
    while True:
        try:
            opened = env.wait_pending(run_id, timeout_s=5)
        except AssertionError:  # the run ended
            return most
        most = max(most, len(opened))
        request = min(opened, key=lambda r: r.item_index)
        if request.item_index in failing:
            env.fail(request, f"printer jammed on {request.item_index}")
        else:
            env.complete(request, {"label": request.item_index})
        answered += 1
        env.wait_fact(run_id, BoundaryCompletionAdmitted, count=answered)
