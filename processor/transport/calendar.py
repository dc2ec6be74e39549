"""A schedule's calendar: the first fire time after a time, from a cron expression (in
an explicit IANA time zone, with ``cronsim``) or an interval.

It reads dates and time zones, so it lives beside the clock, outside the pure core;
``processor/model/schedules.py`` takes it as a function (``NextFire``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from processor.model.schedules import NextFire, ScheduleSpec

__all__ = ["CalendarError", "calendar", "check_calendar"]


class CalendarError(ValueError):
    """A cron expression or a time zone that cannot be used; ``reason`` says which."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise CalendarError("unknown_time_zone", f"no time zone named {name!r}") from exc


def calendar(spec: ScheduleSpec) -> NextFire:
    """The next-fire function of ``spec``; CalendarError if it has no usable calendar."""
    zone = _zone(spec.timezone)
    if spec.interval_ms is not None:
        return _every(spec.start_ms, spec.interval_ms)
    if spec.cron is None:
        raise CalendarError("bad_schedule", "give a cron expression or an interval")
    expression = spec.cron
    try:
        CronSim(expression, datetime(2000, 1, 1, tzinfo=zone))
    except (CronSimError, ValueError) as exc:
        raise CalendarError("bad_cron", f"cron expression {expression!r}: {exc}") from exc

    def next_cron(after_ms: int) -> int:
        after = datetime.fromtimestamp(after_ms / 1000, UTC).astimezone(zone)
        return int(next(CronSim(expression, after)).timestamp() * 1000)

    return next_cron


def _every(start_ms: int, interval_ms: int) -> NextFire:
    def next_interval(after_ms: int) -> int:
        if after_ms < start_ms:
            return start_ms + interval_ms
        return start_ms + ((after_ms - start_ms) // interval_ms + 1) * interval_ms

    return next_interval


def check_calendar(spec: ScheduleSpec) -> tuple[str, str] | None:
    """(reason, detail) if ``spec``'s cron expression or time zone is unusable, else None."""
    try:
        calendar(spec)
    except CalendarError as exc:
        return exc.reason, exc.detail
    return None
