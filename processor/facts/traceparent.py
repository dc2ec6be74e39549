"""W3C Trace Context ``traceparent`` values: the one format check, shared by all layers.

A traceparent (https://www.w3.org/TR/trace-context/#traceparent-header) is
``<version>-<trace id>-<parent id>-<flags>`` in lower-case hex: 2, 32, 16 and 2
digits; a trace id or parent id of all zeros is invalid, and so is version ``ff``.
"""

from __future__ import annotations

import re

__all__ = ["TRACEPARENT_HEADER", "is_traceparent", "trace_id_of"]

#: The Kafka header that carries a run's traceparent on work, results, requests, outcomes.
TRACEPARENT_HEADER = "traceparent"

_FORMAT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


def is_traceparent(value: str) -> bool:
    """Whether ``value`` is a valid version-00-shaped W3C traceparent."""
    match = _FORMAT.fullmatch(value)
    if match is None:
        return False
    version, trace_id, parent_id, _ = match.groups()
    return version != "ff" and trace_id != "0" * 32 and parent_id != "0" * 16


def trace_id_of(value: str) -> str:
    """The 32-hex-digit trace id of a valid traceparent."""
    return value.split("-", 2)[1]
