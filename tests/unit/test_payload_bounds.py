"""The JSON bounds of ``payload.loads`` hold exactly at their edges."""

from __future__ import annotations

import pytest

from processor.facts.payload import MAX_DEPTH, MAX_INT_DIGITS, InvalidPayloadError, loads


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def test_nesting_up_to_the_bound_parses_and_one_more_is_refused() -> None:
    assert loads(_nested(MAX_DEPTH)) is not None
    with pytest.raises(InvalidPayloadError, match="nested deeper"):
        loads(_nested(MAX_DEPTH + 1))


def test_nesting_far_past_the_interpreter_limit_is_refused() -> None:
    with pytest.raises(InvalidPayloadError, match="nested deeper"):
        loads(_nested(100_000))


def test_many_shallow_arrays_are_not_deep() -> None:
    wide = b"[" + b",".join([b"[1]"] * (MAX_DEPTH * 4)) + b"]"
    assert len(loads(wide)) == MAX_DEPTH * 4


def test_brackets_inside_strings_do_not_count_as_depth() -> None:
    text = b'{"s": "' + b"[" * (MAX_DEPTH * 2) + b'"}'
    assert loads(text) == {"s": "[" * (MAX_DEPTH * 2)}


@pytest.mark.parametrize("sign", ["", "-"])
def test_integers_up_to_the_bound_parse_and_one_digit_more_is_refused(sign: str) -> None:
    assert loads(f"{sign}{'9' * MAX_INT_DIGITS}".encode()) == int(f"{sign}{'9' * MAX_INT_DIGITS}")
    with pytest.raises(InvalidPayloadError, match="digits"):
        loads(f"{sign}{'9' * (MAX_INT_DIGITS + 1)}".encode())


def test_a_long_integer_inside_a_document_is_refused() -> None:
    with pytest.raises(InvalidPayloadError, match="digits"):
        loads(b'{"amount": ' + b"1" * 5000 + b"}")
