"""Paged reads without a log: history pages, topic cursors, record shapes."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.clients import pages
from processor.clients.pages import MAX_PAGE, CursorError, history_page, record_dict
from processor.clients.topic_cursor import decode_cursor, encode_cursor
from processor.facts.codec import encode
from processor.facts.models import DeadLetter, Rejected, StepCompleted


def _history(count: int, run_id: str = "run-1") -> list[bytes]:
    return [
        encode(
            StepCompleted(
                run_id=run_id,
                seq=seq,
                fact_key=f"step/{seq}",
                time_ms=1_000 + seq,
                cause_id="c",
                segment=0,
                attempt=1,
                generation=1,
                step=seq,
                output=json.dumps({"seq": seq}).encode(),
            )
        )
        for seq in range(1, count + 1)
    ]


def _all_pages(facts: list[bytes], limit: int) -> list[list[dict[str, Any]]]:
    found, after = [], 0
    while True:
        page = history_page(facts, after, limit)
        found.append(page.facts)
        if page.next_after is None:
            return found
        after = page.next_after


def test_a_long_history_comes_in_pages_of_at_most_1000_each_fact_once_in_order() -> None:
    facts = _history(2_345)
    found = _all_pages(facts, MAX_PAGE)
    assert [len(p) for p in found] == [1000, 1000, 345]
    seqs = [f["seq"] for page in found for f in page]
    assert seqs == list(range(1, 2_346))
    assert found[1][0]["output"] == {"seq": 1001}  # fact_dict's shape: payloads as JSON


@given(count=st.integers(0, 40), limit=st.integers(1, 12))
def test_pages_cover_the_history_exactly_once(count: int, limit: int) -> None:
    facts = _history(count)
    found = _all_pages(facts, limit)
    seqs = [f["seq"] for page in found for f in page]
    assert seqs == list(range(1, count + 1))
    assert all(len(page) == limit for page in found[:-1])


def test_after_the_last_fact_is_an_empty_last_page() -> None:
    page = history_page(_history(5), 5, 10)
    assert (page.facts, page.next_after) == ([], None)


def test_a_page_decodes_only_a_few_facts_outside_it(monkeypatch: pytest.MonkeyPatch) -> None:
    decoded: list[int] = []
    real = pages.decode_fact

    def counting(raw: bytes | None) -> Any:
        fact = real(raw)
        decoded.append(fact.seq)
        return fact

    monkeypatch.setattr(pages, "decode_fact", counting)
    page = history_page(_history(5_000), 4_000, 10)
    assert [f["seq"] for f in page.facts] == list(range(4_001, 4_011))
    outside = [seq for seq in decoded if not 4_001 <= seq <= 4_010]
    assert len(outside) <= 14  # a binary search over 5,000 facts, not a scan


@pytest.mark.parametrize(("after", "limit"), [(-1, 10), (0, 0), (0, 1001)])
def test_bad_history_page_arguments_are_refused(after: int, limit: int) -> None:
    with pytest.raises(ValueError, match=r"after|limit"):
        history_page(_history(3), after, limit)


def test_a_cursor_round_trips_and_is_urlsafe() -> None:
    cursor = encode_cursor("t.rejected", {0: 5, 3: 12})
    assert set(cursor) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert decode_cursor(cursor, "t.rejected") == {0: 5, 3: 12}
    assert decode_cursor(None, "t.rejected") == {}


def _forged(body: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(body).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "cursor",
    [
        "not-a-cursor!",
        "",
        _forged([1, 2]),
        _forged({"v": 2, "t": "t.rejected", "o": {}}),
        _forged({"v": 1, "t": "t.rejected", "o": {"0": -1}}),
        _forged({"v": 1, "t": "t.rejected", "o": {"x": 1}}),
        _forged({"v": 1, "t": "t.rejected", "o": {"0": True}}),
        _forged({"v": 1, "t": "t.rejected", "o": {"0": "3"}}),
    ],
)
def test_a_bad_cursor_is_a_clear_error(cursor: str) -> None:
    with pytest.raises(CursorError, match=r"^cursor: "):
        decode_cursor(cursor, "t.rejected")


def test_a_cursor_of_another_topic_is_refused() -> None:
    with pytest.raises(CursorError, match="another topic"):
        decode_cursor(encode_cursor("t.dlq", {0: 1}), "t.rejected")


def test_record_shapes_of_rejected_and_dead_letters() -> None:
    rejected = Rejected(
        reason="invalid_token",
        detail="forged",
        source_topic="boundary.completions",
        source_partition=1,
        source_offset=7,
        original_value=b"\x01",
        run_id="r",
        rejected_ms=0,
    )
    shown = record_dict(encode(rejected))
    assert shown["reason"] == "invalid_token"
    assert shown["source"] == "boundary.completions/1@7"
    assert shown["original_value"] == "01"
    letter = DeadLetter(
        run_id="r",
        pipeline="p",
        pipeline_version=1,
        input=b'{"n": 1}',
        step=2,
        attempts=3,
        error="boom",
        error_type="RuntimeError",
        failed_ms=0,
    )
    shown = record_dict(encode(letter))
    assert (shown["run_id"], shown["step"], shown["error"]) == ("r", 2, "boom")
    assert shown["input"] == {"n": 1}
    assert shown["time"].startswith("1970-01-01T00:00:00.000")
    assert record_dict(b"garbage")["reason"] == "undecodable"
