"""The worker's side of emission: what ``ctx.emit`` collects for the attempt's result.

A step's events are pending while it runs; they join the attempt's result when the
step returns and are dropped when it raises (a retry runs it, and emits, again).
The processor decides what is published (``processor.model.emission``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from processor.errors import ConfigurationError
from processor.facts import payload
from processor.facts.models import Emission

__all__ = ["EmissionBuffer", "checked_topics"]

#: What Kafka accepts as a topic name.
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")


def checked_topics(topics: Iterable[str]) -> tuple[str, ...]:
    """Declared emission topics, checked and sorted (a clear error names a bad one)."""
    if isinstance(topics, str):
        raise ConfigurationError("emits takes a list of topic names, not one string")
    checked = set()
    for topic in topics:
        if not isinstance(topic, str) or not _TOPIC.fullmatch(topic) or topic in (".", ".."):
            raise ConfigurationError(f"{topic!r} is not a valid topic name to emit to")
        checked.add(topic)
    return tuple(sorted(checked))


class EmissionBuffer:
    """The events of one attempt: those of the steps that returned, and the running step's."""

    __slots__ = ("_max_bytes", "_pending", "kept")

    def __init__(self, max_bytes: int | None = None) -> None:
        self._max_bytes = max_bytes
        self._pending: list[Emission] = []
        self.kept: list[Emission] = []

    def add(self, step: int, topic: str, value: Any, key: str | None) -> None:
        """A running step emitted ``value`` (JSON) to ``topic`` under ``key``."""
        if not isinstance(topic, str) or not topic:
            raise TypeError(f"emit needs a topic name, not {topic!r}")
        if key is not None and not isinstance(key, str):
            raise TypeError(f"an emitted event's key is a string or None, not {key!r}")
        encoded = payload.dumps(value)
        payload.check_size(encoded, self._max_bytes, f"event emitted to {topic!r}")
        self._pending.append(Emission(step=step, topic=topic, key=key, value=encoded))

    def step_returned(self) -> None:
        """The running step returned: its events go with the result."""
        self.kept.extend(self._pending)
        self._pending.clear()

    def step_raised(self) -> None:
        """The running step raised: its events are dropped."""
        self._pending.clear()
