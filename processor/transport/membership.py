"""Joining a consumer group whatever the log's state: the workers' and the responders'.

A member created while the log cannot be reached (a broker restarting, topics not
made yet) fails with ``TransportError``; a long-running member tries again with a
growing pause, and gives up only when told to stop.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from processor.errors import TransportError
from processor.transport.base import GroupConsumer, Transport

__all__ = ["join_until_stopped"]

logger = logging.getLogger(__name__)

FIRST_PAUSE_S, LONGEST_PAUSE_S = 0.5, 5.0  # between two tries to join


def join_until_stopped(
    transport: Transport,
    group: str,
    topics: Sequence[str],
    stop: threading.Event,
    *,
    who: str,
    instance_id: str | None = None,
) -> GroupConsumer | None:
    """A member of ``group`` reading ``topics`` (static with ``instance_id``), tried
    until it is created; None once ``stop`` is set. ``who`` names it in the log."""
    pause = FIRST_PAUSE_S
    while True:
        try:
            return transport.consumer(group, list(topics), instance_id)
        except TransportError as exc:
            logger.warning("%s: cannot join group %r yet: %s", who, group, exc)
        if stop.wait(pause):
            return None
        pause = min(2 * pause, LONGEST_PAUSE_S)
