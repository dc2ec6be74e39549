"""Snapshots of the schedule stage's state: a partition's schedules as of an offset.

runs.schedules keeps every schedule fact forever (a schedule is its facts), so it grows
with every fire: an interval of a second adds 86,400 facts a day. Folding a partition
from offset 0 at each assignment would grow with it. The stage keeps, per owned
partition, a snapshot of its schedules and the offset they were folded to, and a
restore folds only the facts after that offset.

A snapshot is one JSON file per partition under ``<state_dir>/schedules/``, replaced
atomically (written to a scratch file, then renamed over it). It is a cache of the log,
never its authority: a missing file, or one that cannot be read, names another topic or
another format, is ignored and the partition is folded from offset 0. The stage writes
one only with committed state (after a commit, when it gives the partition away, when
it stops), so a snapshot is always the fold of the facts before its offset.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from processor.model.schedules import ScheduleSpec, ScheduleState

__all__ = ["Snapshot", "load", "save", "snapshot_path"]

logger = logging.getLogger(__name__)

_FORMAT = 1


@dataclasses.dataclass(frozen=True, slots=True)
class Snapshot:
    """A partition's schedules, the fold of its facts before ``offset``."""

    offset: int
    schedules: dict[str, ScheduleState]


def snapshot_path(directory: Path, topic: str, partition: int) -> Path:
    """Where the snapshot of ``partition`` of ``topic`` lives under ``directory``."""
    return directory / f"{topic}-{partition:04d}.json"


def save(path: Path, topic: str, offset: int, schedules: Mapping[str, ScheduleState]) -> None:
    """Replace the snapshot at ``path`` atomically."""
    document = {
        "format": _FORMAT,
        "topic": topic,
        "offset": offset,
        "schedules": [_state_document(state) for state in schedules.values()],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f".{path.name}.writing")
    scratch.write_text(json.dumps(document, separators=(",", ":")))
    os.replace(scratch, path)


def load(path: Path, topic: str) -> Snapshot | None:
    """The snapshot at ``path``, or None if there is none that can be trusted."""
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        logger.warning("schedule snapshot %s unreadable, folding from offset 0: %s", path, exc)
        return None
    try:
        if document["format"] != _FORMAT or document["topic"] != topic:
            return None
        offset = document["offset"]
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset {offset!r}")
        states = [_state_of(found) for found in document["schedules"]]
    except (KeyError, TypeError, ValueError) as exc:
        logger.warning("schedule snapshot %s malformed, folding from offset 0: %s", path, exc)
        return None
    return Snapshot(offset, {state.schedule_id: state for state in states})


def _state_document(state: ScheduleState) -> dict[str, Any]:
    document = dataclasses.asdict(state)
    document["spec"]["input"] = base64.b64encode(state.spec.input).decode()
    return document


def _state_of(document: dict[str, Any]) -> ScheduleState:
    fields = dict(document)
    spec = dict(fields.pop("spec"))
    spec["input"] = base64.b64decode(spec["input"], validate=True)
    return ScheduleState(spec=ScheduleSpec(**spec), **fields)
