"""Which partitions the processor running on a state directory owns, for its readers.

A revoke keeps a partition's store on disk (should the partition come back, it is
caught up from where it was), so the stores under a state directory are not the
partitions its processor owns: after a partition moved to another instance, its
store here is stale, and its runs and tokens are no longer current. Readers list
the partitions the processor owns, as a Kafka Streams instance answers only for
its active tasks.

The processor publishes what it owns (``Ownership``: its instance id, the
partitions whose stores it has caught up and writes, and the partition count) in
``owned-partitions.json``, replaced atomically on every assignment and
revocation, and holds ``owned-partitions.lock`` for as long as it runs
(``OwnershipPublisher``). A reader in another process (``processor runs``) trusts
the record only while that lock is held: a processor that stopped or died, its
lock released by the kernel, owns nothing (``owned_here``). On the embedded log,
whose one processor per data directory owns every partition, every store is read,
whether it runs or not (``listable``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Ownership",
    "OwnershipPublisher",
    "listable",
    "listing_note",
    "owned_here",
]

logger = logging.getLogger(__name__)

_RECORD = "owned-partitions.json"
_LOCK = "owned-partitions.lock"


@dataclass(frozen=True, slots=True)
class Ownership:
    """What the processor of a state directory owns now."""

    instance_id: str
    partitions: tuple[int, ...]
    partition_count: int

    def to_json(self) -> str:
        return json.dumps(
            {
                "instance_id": self.instance_id,
                "partitions": list(self.partitions),
                "partition_count": self.partition_count,
            }
        )

    @staticmethod
    def from_json(text: str) -> Ownership:
        """Raises ``ValueError`` (``json.JSONDecodeError``, ``KeyError``...) for a bad record."""
        found = json.loads(text)
        return Ownership(
            str(found["instance_id"]),
            tuple(int(p) for p in found["partitions"]),
            int(found["partition_count"]),
        )


class OwnershipPublisher:
    """The running processor's side: holds the lock, replaces the record on each change."""

    def __init__(self, state_dir: Path, instance_id: str) -> None:
        state_dir.mkdir(parents=True, exist_ok=True)
        self._state_dir, self._instance_id = state_dir, instance_id
        self._lock_fd: int | None = os.open(state_dir / _LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        # Blocking: the state directory is claimed already, so only a reader's probe,
        # held for an instant, can be in the way.
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)

    def publish(self, partitions: Iterable[int], partition_count: int) -> None:
        """Record ``partitions`` as the ones owned now (atomically: a reader sees the old
        record or the new one)."""
        owned = Ownership(self._instance_id, tuple(sorted(partitions)), partition_count)
        record, staged = self._state_dir / _RECORD, self._state_dir / f".{_RECORD}.{os.getpid()}"
        try:
            staged.write_text(owned.to_json())
            os.replace(staged, record)
        except OSError as exc:  # an outdated record would list stale runs: none is better
            logger.warning("cannot record the partitions owned in %s: %s", record, exc)
            with contextlib.suppress(OSError):
                record.unlink()

    def close(self) -> None:
        """Own nothing any more: remove the record, then release the lock."""
        if self._lock_fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            (self._state_dir / _RECORD).unlink()
        os.close(self._lock_fd)  # closing the descriptor drops the lock
        self._lock_fd = None


def owned_here(state_dir: Path) -> Ownership | None:
    """What the processor running on ``state_dir`` owns; None when none runs there."""
    if not _held(state_dir / _LOCK):
        return None
    try:
        return Ownership.from_json((state_dir / _RECORD).read_text())
    except FileNotFoundError:
        return Ownership("", (), 0)  # starting, or stopping: nothing yet, or no more
    except (ValueError, KeyError, TypeError) as exc:
        logger.warning("ignoring %s: %s", state_dir / _RECORD, exc)
        return Ownership("", (), 0)


def _held(lock: Path) -> bool:
    """Whether a live process holds ``lock`` (a probe: a shared lock taken and let go)."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # drops the probe's lock, if it got one
    return False


def listable(owner: Ownership | None, *, embedded: bool) -> frozenset[int] | None:
    """The partitions whose local stores a listing may read; None: every local store.

    On the embedded log every store: its one processor per data directory owns every
    partition, and no other instance can write them, whether it runs or not. On
    Kafka, the partitions the processor running here owns; none if none runs.
    """
    if embedded:
        return None
    return frozenset() if owner is None else frozenset(owner.partitions)


def listing_note(owner: Ownership | None, *, embedded: bool, state_dir: Path) -> str | None:
    """What to tell whoever lists the local stores of a Kafka deployment, if anything."""
    if embedded:
        return None
    if owner is None:
        return (
            f"no processor runs on {state_dir}: it owns no partition, so nothing is "
            "listed here (list where the processors that own them run)"
        )
    if not owner.partitions:
        return f"the processor running on {state_dir} owns no partition now: nothing is listed"
    if len(owner.partitions) < owner.partition_count:
        shown = ", ".join(map(str, owner.partitions))
        return (
            f"partitions {shown} of {owner.partition_count}, those processor "
            f"{owner.instance_id} owns here; the others are listed where their owners run"
        )
    return None
