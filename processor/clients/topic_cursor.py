"""Opaque cursors of topic pages: the next offset of each partition of one topic.

A cursor is urlsafe base64 (no padding) of a small JSON object. It names its topic,
so a cursor of one topic given for another is refused rather than misread, and it
holds offsets only: records appended after it was made never shift what it points at.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["CursorError", "decode_cursor", "encode_cursor"]

_VERSION = 1


class CursorError(ValueError):
    """A cursor that this module did not make (or made for another topic)."""


def encode_cursor(topic: str, offsets: Mapping[int, int]) -> str:
    """The cursor of ``topic`` positioned at ``offsets`` (partition -> next offset)."""
    body = {"v": _VERSION, "t": topic, "o": {str(p): o for p, o in sorted(offsets.items())}}
    raw = json.dumps(body, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_cursor(cursor: str | None, topic: str) -> dict[int, int]:
    """The offsets a cursor of ``topic`` holds ({} for None: the start of every partition).

    Raises:
        CursorError: ``cursor`` is not a cursor of ``topic``.
    """
    if cursor is None:
        return {}
    body = _body(cursor)
    if body.get("v") != _VERSION or not isinstance(body.get("o"), dict):
        raise CursorError("cursor: not a page cursor (give the next_cursor of a page)")
    if body.get("t") != topic:
        raise CursorError(f"cursor: made for another topic, not {topic}")
    return _offsets(body["o"])


def _body(cursor: str) -> dict[str, Any]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        body = json.loads(raw)
    except (binascii.Error, ValueError):
        raise CursorError("cursor: not a page cursor (give the next_cursor of a page)") from None
    if not isinstance(body, dict):
        raise CursorError("cursor: not a page cursor (give the next_cursor of a page)")
    return body


def _offsets(raw: dict[str, Any]) -> dict[int, int]:
    offsets: dict[int, int] = {}
    for partition, offset in raw.items():
        # bool is an int to Python, never an offset.
        if not partition.isdigit() or type(offset) is not int or offset < 0:
            raise CursorError("cursor: damaged (its offsets are not partition: offset >= 0)")
        offsets[int(partition)] = offset
    return offsets
