"""Seed 004's readiness truth table, rule by rule and outcome by outcome."""

from __future__ import annotations

import pytest

from processor.model.readiness import RULES, NodeStatus, Readiness, Rule, evaluate

# (rule, the needs' statuses, the verdict). Every rule meets every kind of outcome:
# none, succeeded, caught, failed, skipped, and not terminal (pending, running).
TABLE: list[tuple[Rule, tuple[NodeStatus, ...], Readiness]] = [
    # all_success: ready when all succeeded or caught; skip on any other terminal outcome.
    ("all_success", (), "ready"),
    ("all_success", ("succeeded", "caught"), "ready"),
    ("all_success", ("succeeded", "running"), "wait"),
    ("all_success", ("pending",), "wait"),
    ("all_success", ("failed", "running"), "skip"),
    ("all_success", ("skipped", "pending"), "skip"),
    ("all_success", ("succeeded", "skipped"), "skip"),
    # all_done: ready once everything is terminal, whatever it is; never skips.
    ("all_done", (), "ready"),
    ("all_done", ("succeeded", "failed", "skipped", "caught"), "ready"),
    ("all_done", ("failed", "running"), "wait"),
    ("all_done", ("pending",), "wait"),
    # one_failed: ready at the first failure, skip once all are terminal without one.
    ("one_failed", (), "skip"),
    ("one_failed", ("failed", "running"), "ready"),
    ("one_failed", ("skipped", "failed"), "ready"),
    ("one_failed", ("succeeded", "running"), "wait"),
    ("one_failed", ("succeeded", "caught", "skipped"), "skip"),
    # all_failed: ready only if every need failed; skip at the first other terminal.
    ("all_failed", (), "skip"),
    ("all_failed", ("failed", "failed"), "ready"),
    ("all_failed", ("failed", "running"), "wait"),
    ("all_failed", ("failed", "succeeded"), "skip"),
    ("all_failed", ("caught", "pending"), "skip"),
    ("all_failed", ("skipped", "running"), "skip"),
    # none_failed: skip at the first failure, ready once all are terminal without one.
    ("none_failed", (), "ready"),
    ("none_failed", ("succeeded", "skipped", "caught"), "ready"),
    ("none_failed", ("skipped", "running"), "wait"),
    ("none_failed", ("failed", "running"), "skip"),
    # always: ready at once.
    ("always", (), "ready"),
    ("always", ("pending", "running"), "ready"),
    ("always", ("failed", "skipped"), "ready"),
]


@pytest.mark.parametrize(("rule", "outcomes", "verdict"), TABLE)
def test_the_truth_table(rule: Rule, outcomes: tuple[NodeStatus, ...], verdict: Readiness) -> None:
    assert evaluate(rule, outcomes) == verdict


def test_the_table_covers_every_rule_and_every_verdict_it_can_give() -> None:
    verdicts = {rule: {v for r, _, v in TABLE if r == rule} for rule in RULES}
    assert verdicts == {
        "all_success": {"ready", "wait", "skip"},
        "all_done": {"ready", "wait"},
        "one_failed": {"ready", "wait", "skip"},
        "all_failed": {"ready", "wait", "skip"},
        "none_failed": {"ready", "wait", "skip"},
        "always": {"ready"},
    }


@pytest.mark.parametrize("rule", RULES)
def test_a_caught_failure_counts_as_a_success(rule: Rule) -> None:
    assert evaluate(rule, ("caught", "succeeded")) == evaluate(rule, ("succeeded", "succeeded"))


@pytest.mark.parametrize("rule", RULES)
def test_the_order_of_the_needs_does_not_matter(rule: Rule) -> None:
    outcomes: tuple[NodeStatus, ...] = ("running", "failed", "succeeded", "skipped")
    assert evaluate(rule, outcomes) == evaluate(rule, reversed(outcomes))
