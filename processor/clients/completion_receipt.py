"""What became of a completion: admitted, a duplicate, or refused with a reason.

Read from the log, with no reply protocol, so it works for a completion anyone
sent, given where it was written (the producer's delivery report):

- admitted: runs.facts holds a ``BoundaryCompletionAdmitted`` whose ``cause_id``
  is the completion's position, ``<topic>/<partition>/<offset>``;
- refused: admission.rejected holds a ``Rejected`` whose source is that position;
- a duplicate (the same answer again) leaves neither: it is known by the processor
  group having committed its offset past the completion, since those offsets
  commit in the transaction that holds whatever the processor decided on it.

With nothing found before the deadline the completion stays queued: the processor
decides on it when it runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Literal

from processor.admission.arrivals import record_cause
from processor.clients.polling import poll_until
from processor.errors import FactDecodeError
from processor.facts.codec import codec, decode_fact
from processor.facts.models import BoundaryCompletionAdmitted, Rejected
from processor.facts.topics import TopicName
from processor.transport.base import AdminClient, Reader, Record, TopicPartition
from processor.transport.partitioner import partition_for
from processor.transport.topology import Topology

__all__ = [
    "Admission",
    "AdmissionWatch",
    "CompletionReceipt",
    "admitted_by",
    "refusal_of",
]

#: ``queued``: no decision seen (yet); the others are the admission stage's decision.
Admission = Literal["queued", "admitted", "duplicate", "refused"]


@dataclass(frozen=True, slots=True)
class CompletionReceipt:
    """A completion as sent (where it was written), and what admission made of it."""

    run_id: str
    interaction: str
    outcome: str  # the answer sent: success or failure
    idempotency_key: str
    partition: int  # of boundary.completions
    offset: int
    admission: Admission = "queued"
    refusal: str | None = None  # the reason, when refused
    detail: str | None = None
    # Known when the decision was looked up by its key (``Client.completion``): the
    # admitted fact's seq, and when it was decided (the fact's or the rejection's time).
    seq: int | None = None
    decided_ms: int | None = None

    @property
    def queued(self) -> bool:
        """No decision known: not waited for, or none within the wait."""
        return self.admission == "queued"

    def as_dict(self) -> dict[str, Any]:
        """The JSON shape of ``processor complete --json`` and the HTTP API."""
        shown: dict[str, Any] = {
            "run_id": self.run_id,
            "interaction": self.interaction,
            "outcome": self.outcome,
            "idempotency_key": self.idempotency_key,
            "partition": self.partition,
            "offset": self.offset,
            "admission": self.admission,
            "queued": self.queued,
        }
        if self.refusal is not None:
            shown["refusal"] = self.refusal
            shown["detail"] = self.detail
        if self.seq is not None:
            shown["seq"] = self.seq
        if self.decided_ms is not None:
            shown["decided_ms"] = self.decided_ms
        return shown


@dataclass(frozen=True, slots=True)
class _Decision:
    admission: Admission
    refusal: str | None = None
    detail: str | None = None


def admitted_by(record: Record, run_key: bytes, cause: str) -> bool:
    """Whether ``record`` of runs.facts admits the completion read at ``cause``."""
    if record.key != run_key:
        return False
    try:
        fact = decode_fact(record.value)
    except FactDecodeError:  # a fact type this version does not know: not an admission
        return False
    return isinstance(fact, BoundaryCompletionAdmitted) and fact.cause_id == cause


def refusal_of(record: Record, source: tuple[str, int, int]) -> Rejected | None:
    """The rejection in ``record`` (of admission.rejected) if it refused ``source``."""
    try:
        rejected = codec().decode_as(record.value, Rejected)
    except FactDecodeError:
        return None
    where = (rejected.source_topic, rejected.source_partition, rejected.source_offset)
    return rejected if where == source else None


@dataclass
class _Tail:
    """One partition, read from a position on."""

    tp: TopicPartition
    position: int

    def new(self, reader: Reader) -> list[Record]:
        found = [record for batch in reader.read(self.tp, self.position) for record in batch]
        if found:
            self.position = found[-1].offset + 1
        return found


class AdmissionWatch:
    """Where the decision on one run's completion will show: its partition of runs.facts
    and of admission.rejected, from their ends when the watch began.

    Begin it before the completion is produced, so nothing decided on it comes
    before the positions it reads from.
    """

    def __init__(self, reader: Reader, topology: Topology, run_id: str, rejected_partitions: int):
        self._reader = reader
        self._run_key = run_id.encode()
        self._completions = topology.name(TopicName.COMPLETIONS)
        facts = TopicPartition(
            topology.name(TopicName.FACTS), partition_for(self._run_key, topology.partitions)
        )
        rejected = TopicPartition(
            topology.name(TopicName.REJECTED), partition_for(self._run_key, rejected_partitions)
        )
        self._facts = _Tail(facts, reader.end_offset(facts))
        self._rejected = _Tail(rejected, reader.end_offset(rejected))

    def wait(
        self, admin: AdminClient, group: str, sent: CompletionReceipt, deadline: float
    ) -> CompletionReceipt:
        """``sent`` with the decision on it, or as it is (queued) at the ``time.monotonic()``
        deadline. ``group``: the processors' consumer group."""
        decision = poll_until(lambda: self._decided(admin, group, sent, deadline), deadline)
        if decision is None:
            return sent
        return replace(
            sent, admission=decision.admission, refusal=decision.refusal, detail=decision.detail
        )

    def _decided(
        self, admin: AdminClient, group: str, sent: CompletionReceipt, deadline: float
    ) -> _Decision | None:
        found = self._look(sent)
        if found is not None or not self._passed(admin, group, sent):
            return found
        # The processor has decided. What it wrote is in the transaction that committed
        # its offset: once readers can see all of it, nothing found means no-op.
        for tail in (self._facts, self._rejected):
            if not self._reader.wait_stable(tail.tp, max(0.0, deadline - time.monotonic())):
                return None
        return self._look(sent) or _Decision("duplicate")

    def _look(self, sent: CompletionReceipt) -> _Decision | None:
        source = (self._completions, sent.partition, sent.offset)
        for record in self._rejected.new(self._reader):
            rejected = refusal_of(record, source)
            if rejected is not None:
                return _Decision("refused", rejected.reason, rejected.detail)
        cause = record_cause(*source)
        if any(admitted_by(r, self._run_key, cause) for r in self._facts.new(self._reader)):
            return _Decision("admitted")
        return None

    def _passed(self, admin: AdminClient, group: str, sent: CompletionReceipt) -> bool:
        """Whether the processors have committed their position past the completion."""
        tp = TopicPartition(self._completions, sent.partition)
        return admin.committed_offsets(group, [tp]).get(tp, 0) > sent.offset
