"""What the processor's side stages share (the trigger stage, the schedule stage).

Each is a consumer-group member of its own with a transactional session of its own
(``ProcessorSession``). Both run rounds until stopped, waiting out an unavailable log
with a growing pause, and commit each round's records with its consumed offsets in one
transaction; a round that does not commit is decided again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

from processor.errors import FencedError, SessionLostError, TransportError
from processor.transport.base import Outbound, ProcessorSession, TopicPartition

__all__ = ["close_quietly", "commit_round", "join", "run_rounds"]

logger = logging.getLogger(__name__)

#: The longest pause between two tries while the log is unavailable.
MAX_PAUSE_S = 5.0

Rebalanced = Callable[[Sequence[TopicPartition]], None]


def run_rounds(
    name: str,
    stop: threading.Event,
    run_once: Callable[[], object],
    drop_session: Callable[[], None],
) -> None:
    """Call ``run_once`` until ``stop`` is set. A ``TransportError`` (the log is down, a
    topic is missing: it may be created later) drops the session, then the round is
    tried again after a pause that doubles up to ``MAX_PAUSE_S``."""
    pause = 0.1
    while not stop.is_set():
        try:
            run_once()
            pause = 0.1
        except TransportError as exc:
            logger.warning("%s: %s; retrying in %.1fs", name, exc, pause)
            drop_session()
            stop.wait(pause)
            pause = min(pause * 2, MAX_PAUSE_S)


def join(
    name: str,
    session: ProcessorSession,
    topics: list[str],
    *,
    on_assign: Rebalanced,
    on_revoke: Rebalanced,
) -> ProcessorSession:
    """``session`` (new) subscribed to ``topics``; closed again if that fails."""
    try:
        session.subscribe(topics, on_assign, on_revoke)
    except BaseException:
        close_quietly(name, session)
        raise
    return session


def commit_round(
    name: str,
    session: ProcessorSession,
    outbound: Iterable[Outbound],
    consumed: Mapping[TopicPartition, int],
    drop_session: Callable[[], None],
) -> list[tuple[TopicPartition, int]] | None:
    """Produce ``outbound`` and commit it with the ``consumed`` offsets in one
    transaction; return where the records landed, or None if nothing committed: the
    round is then decided again (after a rejoin, if another member fenced this one)."""
    try:
        session.begin()
        for record in outbound:
            session.produce(record)
        return list(session.commit(consumed))
    except (FencedError, SessionLostError) as exc:
        # Another member owns these partitions now (or our producer hung): the round is
        # its to decide; a new session fences the stuck one before it reads.
        logger.warning("%s: %s; rejoining, the round will be decided again", name, exc)
        drop_session()
        return None
    except TransportError as exc:
        logger.warning("%s: commit failed, the round will be decided again: %s", name, exc)
        try:
            session.abort()
        except TransportError:
            drop_session()
        return None


def close_quietly(name: str, session: ProcessorSession) -> None:
    """Close a session that may be broken: closing it cannot make it worse."""
    try:
        session.close()
    except TransportError as exc:
        logger.warning("%s: closing the old session failed: %s", name, exc)
