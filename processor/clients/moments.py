"""Points in time as people type them: epoch milliseconds, ISO-8601, or a time ago."""

from __future__ import annotations

import re
from datetime import UTC, datetime

__all__ = ["parse_moment"]

_AGO = re.compile(r"(\d+)(ms|s|m|h|d|w)")
_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


def parse_moment(text: str, now_ms: int) -> int:
    """Epoch milliseconds of ``text``: epoch ms (``1733097600000``), an ISO-8601 time
    (``2026-12-01T10:00:00Z``; without an offset, UTC), or a duration back from
    ``now_ms`` (``90s``, ``10m``, ``2h``, ``1d``, ``1w``, ``1h30m``).

    Raises:
        ValueError: anything else, saying what is accepted.
    """
    text = text.strip()
    if text.isdigit():
        return int(text)
    ago = _duration_ms(text)
    if ago is not None:
        return max(0, now_ms - ago)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is no time: give epoch milliseconds, an ISO-8601 time "
            "(2026-12-01T10:00:00Z) or a duration back from now (10m, 2h, 1d)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _duration_ms(text: str) -> int | None:
    """``1h30m`` as milliseconds; None if ``text`` is no duration."""
    parts = _AGO.findall(text)
    if not parts or "".join(n + unit for n, unit in parts) != text:
        return None
    return sum(int(n) * _UNIT_MS[unit] for n, unit in parts)
