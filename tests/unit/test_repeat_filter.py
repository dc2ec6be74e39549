"""librdkafka's repeated lines are let through once per window, with a count of the rest."""

from __future__ import annotations

import logging

from processor.transport.kafka_common import LIBRDKAFKA_LOGGER, RepeatFilter


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def record(message: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("librdkafka", logging.ERROR, __file__, 1, message, args, None)


def refused(client: int, after_ms: int) -> logging.LogRecord:
    return record(
        "FAIL [rdkafka#consumer-%d] 127.0.0.1:9092/bootstrap: Connect to ipv4#127.0.0.1:9092 "
        "failed: Connection refused (after %dms in state CONNECT)",
        client,
        after_ms,
    )


def test_one_line_per_shape_per_window_then_the_count_of_dropped_ones() -> None:
    clock = Clock()
    repeats = RepeatFilter(window_s=30.0, clock=clock)
    passed = []
    for step in range(200):  # 20 s of reconnect failures from 4 clients
        clock.now = step * 0.1
        line = refused(step % 4, step % 3)
        if repeats.filter(line):
            passed.append(line.getMessage())
    assert len(passed) == 1
    other = record("FAIL [rdkafka#producer-1] GroupCoordinator: Disconnected")
    assert repeats.filter(other)  # another shape is not held back

    clock.now = 31.0
    later = refused(9, 0)
    assert repeats.filter(later)
    assert later.getMessage().endswith("(199 similar lines dropped in 30s)")
    clock.now = 31.5
    assert not repeats.filter(refused(1, 5))


def test_the_librdkafka_logger_has_it() -> None:
    assert any(isinstance(f, RepeatFilter) for f in LIBRDKAFKA_LOGGER.filters)
