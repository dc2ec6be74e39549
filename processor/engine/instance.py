"""A processor instance's identity, kept with its state directory.

The instance id names the processor's transactional producer on Kafka
(``transactional.id = group-instance``). Keeping it in the state directory
means a processor restarted after a crash comes back under the same id: its
new producer fences the old one at once and aborts the transaction it left
open, instead of every read_committed reader (its own restore included)
waiting for the broker's transaction timeout. Kafka Streams keeps its process
id in its state directory for the same reason.

One state directory belongs to one running processor: ``claim_instance`` takes
an exclusive lock on it for the life of the process (two processors sharing an
id would fence each other in turn), and refuses with a clear error otherwise.
"""

from __future__ import annotations

import fcntl
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

from processor.errors import ConfigurationError

__all__ = ["InstanceClaim", "claim_instance"]

_ID_FILE = "instance-id"
_LOCK_FILE = "instance.lock"
_VALID_ID = re.compile(r"[A-Za-z0-9._-]{1,200}")


@dataclass
class InstanceClaim:
    """The instance id and the lock that reserves its state directory."""

    instance_id: str
    _lock_fd: int | None

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor drops the lock
            self._lock_fd = None


def claim_instance(state_dir: Path, configured: str | None = None) -> InstanceClaim:
    """Lock ``state_dir`` for this process; return the instance id to run under.

    ``configured`` (``PROCESSOR_INSTANCE_ID``) wins and is remembered; otherwise
    the id remembered in the directory, else a new one.
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(state_dir / _LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigurationError(
            f"another processor is running with the state directory {state_dir}; "
            "give each processor its own PROCESSOR_DATA_DIR"
        ) from None
    try:
        instance_id = _remembered_id(state_dir / _ID_FILE, configured)
    except BaseException:
        os.close(fd)
        raise
    return InstanceClaim(instance_id, fd)


def _remembered_id(path: Path, configured: str | None) -> str:
    if configured is not None and not _VALID_ID.fullmatch(configured):
        raise ConfigurationError(
            f"instance id {configured!r}: use 1 to 200 letters, digits, '.', '_' or '-'"
        )
    stored = path.read_text().strip() if path.exists() else None
    if configured is not None:
        if configured != stored:
            _write(path, configured)
        return configured
    if stored and _VALID_ID.fullmatch(stored):
        return stored
    created = f"processor-{uuid.uuid4().hex[:12]}"
    _write(path, created)
    return created


def _write(path: Path, instance_id: str) -> None:
    """Replace the id file atomically (a crash leaves the old or the new id, never half)."""
    scratch = path.with_suffix(".tmp")
    scratch.write_text(instance_id + "\n")
    os.replace(scratch, path)
