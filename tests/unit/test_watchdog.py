"""The watchdog gives up on a blocking call after its deadline, and never calls again."""

from __future__ import annotations

import threading
import time

import pytest

from processor.errors import SessionLostError, TransportError
from processor.transport.watchdog import Watchdog
from tests.apps.support import wait_until

DEADLINE_S = 0.3
#: How late the caller may get control back after the deadline (a loaded test machine).
SLACK_S = 2.0


class Blocking:
    """A call that blocks (ignoring any timeout) until released, like librdkafka#5456."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.released = threading.Event()
        self.returned = threading.Event()

    def __call__(self) -> str:
        self.entered.set()
        self.released.wait()
        self.returned.set()
        return "late"


def test_a_call_that_returns_in_time_gives_its_result_or_its_exception() -> None:
    watchdog = Watchdog("client", DEADLINE_S)
    assert watchdog.call("answer", lambda: 42) == 42
    with pytest.raises(KeyError):
        watchdog.call("fail", lambda: {}["missing"])
    assert watchdog.stuck is None
    watchdog.close(lambda: None)


def test_a_call_that_hangs_is_abandoned_at_the_deadline_and_the_client_refused() -> None:
    watchdog = Watchdog("client", DEADLINE_S)
    hanging = Blocking()
    started = time.monotonic()
    with pytest.raises(SessionLostError, match="send offsets hung"):
        watchdog.call("send offsets", hanging)
    elapsed = time.monotonic() - started
    assert DEADLINE_S <= elapsed < DEADLINE_S + SLACK_S
    assert hanging.entered.is_set() and not hanging.returned.is_set()
    assert watchdog.stuck == "send offsets"
    assert issubclass(SessionLostError, TransportError)  # the loop's transport handling applies

    # Nothing else reaches the client, not even a call that would be quick.
    called: list[str] = []
    with pytest.raises(SessionLostError):
        watchdog.call("poll", lambda: called.append("poll"))
    with pytest.raises(SessionLostError):
        watchdog.check()

    # Closing does not wait for the stuck call; the cleanup runs once it returns.
    closed = threading.Event()
    started = time.monotonic()
    watchdog.close(closed.set)
    assert time.monotonic() - started < SLACK_S
    assert not closed.is_set()
    hanging.released.set()
    wait_until(closed.is_set, 10, "the cleanup after the stuck call")
    assert called == []


def test_a_cleanup_that_hangs_does_not_hang_close() -> None:
    watchdog = Watchdog("client", DEADLINE_S)
    hanging = Blocking()
    started = time.monotonic()
    watchdog.close(hanging)
    assert DEADLINE_S <= time.monotonic() - started < DEADLINE_S + SLACK_S
    assert watchdog.stuck == "close"
    hanging.released.set()
    wait_until(hanging.returned.is_set, 10, "the cleanup to finish")
