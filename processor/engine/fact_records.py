"""The facts of a transaction as records of runs.facts: one a fact, or batched a run.

With ``PROCESSOR_FACT_BATCHES`` the facts a transaction appends to one run leave as
one record (``facts/fact_batch.py``) instead of one each: a standard run's fifteen
facts become two or three records, and the broker stores, replicates and indexes
that much less. Readers expand them again (``transport/fact_batches.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from processor.facts.fact_batch import pack
from processor.transport.base import Outbound

__all__ = ["batched"]


def batched(outbound: Sequence[Outbound], facts_topic: str) -> list[Outbound]:
    """``outbound`` with the facts of each run (records of ``facts_topic`` with one key
    and partition) packed into as few records as fit, in their order.

    The other records keep their order and come first; each run's records follow in
    the order its first fact was appended. Order across runs is not kept, and need
    not be: nothing reads a partition's facts across runs in order.
    """
    others: list[Outbound] = []
    runs: dict[tuple[bytes, int | None], list[bytes]] = {}
    for record in outbound:
        if record.topic != facts_topic:
            others.append(record)
        else:
            runs.setdefault((record.key, record.partition), []).append(record.value)
    for (key, partition), values in runs.items():
        others.extend(Outbound(facts_topic, key, value, (), partition) for value in pack(values))
    return others
