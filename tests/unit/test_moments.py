"""Times as ``processor runs --since/--until`` take them."""

from __future__ import annotations

import pytest

from processor.clients.moments import parse_moment

NOW = 1_800_000_000_000


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1733097600000", 1_733_097_600_000),
        ("2026-12-01T10:00:00Z", 1_796_119_200_000),
        ("2026-12-01T11:00:00+01:00", 1_796_119_200_000),
        ("2026-12-01T10:00:00", 1_796_119_200_000),  # no offset: UTC
        ("2026-12-01", 1_796_083_200_000),
        ("90s", NOW - 90_000),
        ("10m", NOW - 600_000),
        ("2h", NOW - 7_200_000),
        ("1d", NOW - 86_400_000),
        ("1h30m", NOW - 5_400_000),
        ("250ms", NOW - 250),
    ],
)
def test_a_moment_is_epoch_ms_an_iso_time_or_a_time_ago(text: str, expected: int) -> None:
    assert parse_moment(text, NOW) == expected


@pytest.mark.parametrize("text", ["", "soon", "10 minutes", "h2", "-5", "10m ago", "2026-13-01"])
def test_anything_else_is_refused_with_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match="is no time: give epoch milliseconds, an ISO-8601"):
        parse_moment(text, NOW)
