"""Readiness rules: whether a graph node may run, given the outcomes of the nodes it needs.

Seed 004's truth table (``EvaluateReadiness``, Airflow-style), exactly:

- ``all_success``: ready when every need succeeded or was caught; skip as soon as any
  other terminal outcome (failed, skipped) appears; otherwise wait.
- ``all_done``: ready when every need is terminal; otherwise wait.
- ``one_failed``: ready as soon as one need failed; skip once every need is terminal
  without a failure; otherwise wait.
- ``all_failed``: ready only when every need failed (and there is one); skip as soon as
  a terminal outcome other than a failure appears; otherwise wait.
- ``none_failed``: skip as soon as a need failed; ready once every need is terminal
  without a failure; otherwise wait.
- ``always``: ready at once, without waiting for the needs.

With no needs at all, ``all_success``, ``all_done``, ``none_failed`` and ``always``
are ready and ``one_failed`` and ``all_failed`` skip. ``failed`` means a failure no
catch handled; ``caught`` (handled by a catch) counts as a success. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, get_args

__all__ = [
    "RULES",
    "TERMINAL",
    "NodeStatus",
    "Readiness",
    "Rule",
    "evaluate",
]

Rule = Literal["all_success", "all_done", "one_failed", "all_failed", "none_failed", "always"]
#: Every rule, in the order seed 004 lists them.
RULES: tuple[Rule, ...] = get_args(Rule)
#: A node's status in a run. ``pending`` and ``running`` are not terminal yet.
NodeStatus = Literal["pending", "running", "succeeded", "failed", "caught", "skipped"]
TERMINAL: frozenset[NodeStatus] = frozenset({"succeeded", "failed", "caught", "skipped"})
Readiness = Literal["ready", "wait", "skip"]

_SUCCESS: frozenset[NodeStatus] = frozenset({"succeeded", "caught"})


def evaluate(rule: Rule, outcomes: Iterable[NodeStatus]) -> Readiness:
    """Apply ``rule`` to the outcomes of a node's needs: ``ready``, ``wait`` or ``skip``."""
    seen = tuple(outcomes)
    done = all(o in TERMINAL for o in seen)
    failed = any(o == "failed" for o in seen)
    match rule:
        case "all_success":
            if any(o in TERMINAL and o not in _SUCCESS for o in seen):
                return "skip"
            return "ready" if done else "wait"
        case "all_done":
            return "ready" if done else "wait"
        case "one_failed":
            return "ready" if failed else "skip" if done else "wait"
        case "all_failed":
            if any(o in TERMINAL and o != "failed" for o in seen) or not seen:
                return "skip"
            return "ready" if done else "wait"
        case "none_failed":
            return "skip" if failed else "ready" if done else "wait"
        case "always":
            return "ready"
