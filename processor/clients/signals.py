"""Sending events to waiting runs (``processor signal``, ``Client.signal``, the API).

An event is a ``SignalEvent`` on boundary.events: for one run (keyed by its run id) or
by correlation key (keyed by that key: the correlation index on that key's partition
forwards it to every run waiting on it; docs/design/signals.md). The processor's
admission stage decides on it; a refusal lands in admission.rejected with its reason.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from processor.facts import payload
from processor.facts.codec import encode
from processor.facts.models import SignalEvent
from processor.facts.topics import TopicName
from processor.transport.base import Outbound, Producer, TopicPartition
from processor.transport.topology import Topology

__all__ = ["SentEvent", "build_event", "send_event"]


@dataclass(frozen=True, slots=True)
class SentEvent:
    """An event as produced: its id and where it was written."""

    event_id: str
    name: str
    partition: int
    offset: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "event_id": self.event_id,
            "name": self.name,
            "partition": self.partition,
            "offset": self.offset,
        }


def build_event(
    name: str,
    value: Any,
    *,
    run_id: str | None = None,
    key: str | None = None,
    correlation: Mapping[str, str] | None = None,
    event_id: str | None = None,
    max_payload_bytes: int,
    sent_ms: int = 0,
) -> SignalEvent:
    """A checked event; raises ValueError for a bad address, name or correlation (and
    ``PayloadTooLarge``, a ValueError, for a payload over the limit)."""
    if (run_id is None) == (key is None):
        raise ValueError("address an event to a run_id or a correlation key, exactly one")
    if not name:
        raise ValueError("an event needs a name")
    fields = dict(correlation or {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in fields.items()):
        raise ValueError("correlation: an object of string fields")
    body = payload.dumps(value)
    too_large = payload.oversize(body, max_payload_bytes, "event payload")
    if too_large is not None:
        raise payload.PayloadTooLarge(too_large)
    return SignalEvent(
        event_id=event_id or str(uuid.uuid4()),
        name=name,
        run_id=run_id,
        correlation_key=key,
        correlation=fields,
        payload=body,
        sent_ms=sent_ms,
    )


def send_event(producer: Producer, topology: Topology, event: SignalEvent) -> SentEvent:
    """Produce ``event`` to boundary.events, keyed by its run id or correlation key, and
    wait until it is durable."""
    address = event.run_id if event.run_id is not None else event.correlation_key
    assert address is not None
    record = Outbound(topology.name(TopicName.EVENTS), address.encode(), encode(event))
    where: TopicPartition
    where, offset = producer.deliver(record)
    return SentEvent(event.event_id, event.name, where.partition, offset)
