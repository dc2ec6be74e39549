"""Joining a group while the log cannot be reached: tried again until it works or stop."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest

from processor.errors import TransportError
from processor.transport import membership
from processor.transport.membership import join_until_stopped


class _Unreachable:
    """A transport whose first ``failures`` consumers cannot be made."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.asked: list[tuple[str, list[str], str | None]] = []

    def consumer(self, group: str, topics: Sequence[str], instance_id: str | None = None) -> Any:
        self.asked.append((group, list(topics), instance_id))
        if len(self.asked) <= self.failures:
            raise TransportError("broker down")
        return "member"


@pytest.fixture(autouse=True)
def _short_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(membership, "FIRST_PAUSE_S", 0.001)
    monkeypatch.setattr(membership, "LONGEST_PAUSE_S", 0.002)


def test_a_member_is_tried_again_until_the_log_answers(caplog: pytest.LogCaptureFixture) -> None:
    transport = _Unreachable(failures=3)
    joined = join_until_stopped(
        transport,  # type: ignore[arg-type]
        "workers",
        ["t.segments.work"],
        threading.Event(),
        who="w0",
        instance_id="p-w0",
    )
    assert joined == "member"
    assert transport.asked == [("workers", ["t.segments.work"], "p-w0")] * 4
    assert caplog.text.count("w0: cannot join group 'workers' yet: broker down") == 3


def test_a_stop_ends_the_tries_without_a_member() -> None:
    transport = _Unreachable(failures=10**9)
    stop = threading.Event()
    stop.set()
    assert join_until_stopped(transport, "g", ["t"], stop, who="responder") is None  # type: ignore[arg-type]
    assert len(transport.asked) == 1
