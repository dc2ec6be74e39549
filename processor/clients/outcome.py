"""How a run ended, read from its terminal fact (what ``Client.wait`` returns)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from processor.facts import payload
from processor.facts.models import FactHeader, RunFailed, RunRedriven, RunStopped, RunSucceeded

__all__ = ["RunResult", "terminal_result"]

Ending = Literal["succeeded", "failed", "cancelled", "timed_out"]


@dataclass(frozen=True, slots=True)
class RunResult:
    """A run's outcome: its status, with the output (succeeded) or the error (otherwise).

    ``recovery`` is the compensation outcome of a run that did not succeed
    (NotRequired, Compensated, PartiallyCompensated, CompensationFailed).
    """

    run_id: str
    status: Ending
    output: Any = None
    error: str | None = None
    error_type: str | None = None
    recovery: str | None = None

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"


def terminal_result(facts: Iterable[FactHeader]) -> RunResult | None:
    """The outcome recorded by the last terminal fact among ``facts``; None while running
    (a redrive after a terminal fact makes the run running again)."""
    found = None
    for fact in facts:
        if isinstance(fact, RunRedriven):
            found = None
            continue
        result = _result(fact)
        if result is not None:
            found = result
    return found


def _result(fact: FactHeader) -> RunResult | None:
    match fact:
        case RunSucceeded():
            return RunResult(fact.run_id, "succeeded", output=payload.loads(fact.result))
        case RunFailed():
            return RunResult(
                fact.run_id,
                "failed",
                error=fact.error,
                error_type=fact.error_type,
                recovery=fact.recovery,
            )
        case RunStopped():
            status: Ending = "cancelled" if fact.execution == "Cancelled" else "timed_out"
            return RunResult(fact.run_id, status, error=fact.detail or None, recovery=fact.recovery)
        case _:
            return None
