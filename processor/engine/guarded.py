"""Threads whose crash stops the service they belong to (the Host, its workers' child)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

__all__ = ["start_guarded"]

logger = logging.getLogger(__name__)


def start_guarded(
    name: str, target: Callable[[], None], errors: list[BaseException], stop: threading.Event
) -> threading.Thread:
    """Run ``target`` on a daemon thread named ``name``; if it raises, log it, keep the
    exception in ``errors`` and set ``stop``, so the service stops rather than limps on."""

    def guarded() -> None:
        try:
            target()
        except BaseException as exc:
            logger.exception("%s crashed", name)
            errors.append(exc)
            stop.set()

    thread = threading.Thread(target=guarded, name=name, daemon=True)
    thread.start()
    return thread
