"""What the processor of a state directory owns, as its local readers learn it."""

from __future__ import annotations

from pathlib import Path

import pytest

from processor.store.ownership import (
    Ownership,
    OwnershipPublisher,
    listable,
    listing_note,
    owned_here,
)


def test_a_running_processor_publishes_each_change_and_owns_nothing_once_closed(
    tmp_path: Path,
) -> None:
    assert owned_here(tmp_path) is None  # nothing ever ran here
    publisher = OwnershipPublisher(tmp_path, "i-1")
    try:
        assert owned_here(tmp_path) == Ownership("", (), 0)  # running, nothing assigned yet
        publisher.publish([3, 0, 1, 2], 4)
        assert owned_here(tmp_path) == Ownership("i-1", (0, 1, 2, 3), 4)
        publisher.publish([2, 0], 4)  # 1 and 3 moved to another instance
        assert owned_here(tmp_path) == Ownership("i-1", (0, 2), 4)
    finally:
        publisher.close()
    assert owned_here(tmp_path) is None
    publisher.close()  # twice: nothing more


def test_a_record_is_trusted_only_while_its_processor_holds_the_lock(tmp_path: Path) -> None:
    publisher = OwnershipPublisher(tmp_path, "i-1")
    publisher.publish([0, 1], 2)
    record = (tmp_path / "owned-partitions.json").read_text()
    publisher.close()
    # What a processor killed with -9 leaves: its record, and a lock nobody holds.
    (tmp_path / "owned-partitions.json").write_text(record)
    assert owned_here(tmp_path) is None


def test_an_unreadable_record_owns_nothing(tmp_path: Path) -> None:
    publisher = OwnershipPublisher(tmp_path, "i-1")
    try:
        (tmp_path / "owned-partitions.json").write_text("{not json")
        assert owned_here(tmp_path) == Ownership("", (), 0)
    finally:
        publisher.close()


@pytest.mark.parametrize(
    ("owner", "embedded", "expected"),
    [
        (None, True, None),  # the embedded log: every store, running or not
        (Ownership("i", (0,), 4), True, None),
        (None, False, frozenset()),  # Kafka, no processor here: it owns nothing
        (Ownership("i", (0, 2), 4), False, frozenset({0, 2})),
    ],
)
def test_what_a_listing_may_read(
    owner: Ownership | None, embedded: bool, expected: frozenset[int] | None
) -> None:
    assert listable(owner, embedded=embedded) == expected


def test_a_listing_says_when_it_is_not_every_partition(tmp_path: Path) -> None:
    def note(owner: Ownership | None, embedded: bool = False) -> str | None:
        return listing_note(owner, embedded=embedded, state_dir=tmp_path)

    assert note(None, embedded=True) is None
    assert note(Ownership("i", (0, 1), 2)) is None
    assert "no processor runs" in (note(None) or "")
    assert "owns no partition now" in (note(Ownership("", (), 0)) or "")
    partial = note(Ownership("i-7", (0, 2), 4)) or ""
    assert "partitions 0, 2 of 4" in partial and "i-7" in partial
