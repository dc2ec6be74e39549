"""Waiting until committed transactional records are visible to read_committed readers.

``commit_transaction`` returns once the transaction coordinator has logged the
commit decision; it writes the commit markers to the data partitions right
after, asynchronously. Until a partition's marker is written, its last stable
offset (LSO) stays before our records and read_committed readers cannot see
them. ``StableOffsets.wait_past`` polls the LSO of the written partitions (one
ListOffsets request per poll, via an admin client) until it passes them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import IsolationLevel, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec  # not re-exported

from processor.transport.base import TopicPartition

__all__ = ["StableOffsets"]

logger = logging.getLogger(__name__)

_LATEST: Any = OffsetSpec.latest()  # type: ignore[no-untyped-call]
_REQUEST_TIMEOUT_S = 10.0
_PAUSE_S = 0.001


class StableOffsets:
    """Queries last stable offsets of partitions; created lazily on first use."""

    def __init__(self, config: dict[str, Any]) -> None:
        self._config = config
        self._admin: AdminClient | None = None

    def wait_past(self, ends: Mapping[TopicPartition, int], timeout_s: float) -> bool:
        """Wait until the LSO of each partition reaches its end in ``ends``; False on timeout.

        Best effort: another producer's transaction that is open on one of these
        partitions holds its LSO back until it ends, which no one can hurry.
        """
        deadline = time.monotonic() + timeout_s
        pending = dict(ends)
        while pending:
            stable = self._stable_offsets(list(pending))
            pending = {tp: end for tp, end in pending.items() if stable.get(tp, -1) < end}
            if not pending:
                return True
            if time.monotonic() >= deadline:
                logger.info("commit markers not visible after %.1fs: %s", timeout_s, pending)
                return False
            time.sleep(_PAUSE_S)  # the markers are being written; there is no event to wait on
        return True

    def _stable_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        if self._admin is None:
            self._admin = AdminClient(self._config)
        request = {KafkaTopicPartition(tp.topic, tp.partition): _LATEST for tp in partitions}
        try:
            futures = self._admin.list_offsets(
                request,
                isolation_level=IsolationLevel.READ_COMMITTED,
                request_timeout=_REQUEST_TIMEOUT_S,
            )
            return {
                TopicPartition(ktp.topic, ktp.partition): future.result().offset
                for ktp, future in futures.items()
            }
        except KafkaException as exc:
            logger.info("listing stable offsets failed: %s", exc)
            return {}
