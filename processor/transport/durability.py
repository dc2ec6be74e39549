"""Durability modes: what a committed record survives, named from how the log is set up.

A commit is durable once the log acknowledged it; how far that acknowledgement goes
depends on the log:

- ``embedded``: the embedded log in WAL mode with ``synchronous=NORMAL``
  (``PROCESSOR_DURABLE_FSYNC=false``, the default). A commit survives a crash of any
  process; a power loss or an OS crash may lose the last commits (never corrupts the
  log: SQLite rolls back to a consistent point).
- ``embedded-fsync``: ``synchronous=FULL`` (``PROCESSOR_DURABLE_FSYNC=true``). Every
  commit is on disk before it is acknowledged: it survives a power loss too.
- ``kafka-single-copy``: a journal with one replica, or ``min.insync.replicas`` 1.
  Every producer writes with ``acks=all``, but all may be one broker: a commit
  survives a crash of any process, the broker's included (its page cache stays with
  the OS), but not the loss of that broker's machine or disk.
- ``kafka-replicated``: replication ``R`` and ``min.insync.replicas`` ``M`` of at least
  2. A commit is acknowledged only once ``M`` brokers hold it: it survives the loss of
  ``M - 1`` brokers with their machines. While fewer than ``M`` replicas are in sync,
  commits wait or fail (the processor retries): the log stops, it does not lose.

Kafka brokers do not fsync per record by default (``log.flush.interval.messages``);
they rely on replication. A power loss of every broker at once can therefore lose
the last records in every mode but ``embedded-fsync``. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Durability", "DurabilityMode", "embedded_durability", "kafka_durability"]

DurabilityMode = Literal["embedded", "embedded-fsync", "kafka-single-copy", "kafka-replicated"]


@dataclass(frozen=True, slots=True)
class Durability:
    """A durability mode and the figures it was named from."""

    mode: DurabilityMode
    survives: str
    replication: int = 1
    min_insync_replicas: int = 1

    def describe(self) -> str:
        """One line for the start-up log: the mode, its figures and what it survives."""
        figures = (
            f" (replication {self.replication}, min.insync.replicas {self.min_insync_replicas})"
            if self.mode.startswith("kafka")
            else ""
        )
        return f"durability {self.mode}{figures}: a commit survives {self.survives}"


def embedded_durability(fsync: bool) -> Durability:
    """The embedded log's mode, with or without an fsync per commit."""
    if fsync:
        return Durability("embedded-fsync", "a process crash and a power loss")
    return Durability("embedded", "a process crash, not a power loss or an OS crash")


def kafka_durability(replication: int, min_insync_replicas: int) -> Durability:
    """The mode of a journal with ``replication`` replicas, written with ``acks=all``."""
    acknowledged_by = min(replication, min_insync_replicas)
    if acknowledged_by < 2:
        return Durability(
            "kafka-single-copy",
            "a crash of any process, the broker's included; not the loss of its machine",
            replication,
            min_insync_replicas,
        )
    lost = acknowledged_by - 1
    brokers = "broker" if lost == 1 else "brokers"
    return Durability(
        "kafka-replicated",
        f"the loss of {lost} {brokers} with {'its' if lost == 1 else 'their'} machine",
        replication,
        min_insync_replicas,
    )
