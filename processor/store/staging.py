"""The open batch of one partition: decisions folded in memory until the commit.

Decide reads through the staged runs, so several inputs for one run in one batch
see each other's facts. After the log transaction commits, ``flush`` writes every
change in one WriteBatch together with the facts offset; after an abort,
``discard`` forgets it all.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from processor.facts.codec import encode
from processor.facts.models import FactHeader
from processor.model.due import due_entries
from processor.model.journal import plan_append
from processor.model.reduce import fold, reduce
from processor.model.state import RunState
from processor.store.rocks import PartitionStore, StoreBatch

__all__ = ["StagedFact", "Staging"]


@dataclass(frozen=True, slots=True)
class StagedFact:
    fact: FactHeader
    encoded: bytes


class Staging:
    """Pending projection changes of one partition store.

    With ``carry``, the runs written by the last ``flush`` are kept in memory (they
    equal the store's rows, as long as this staging is the store's only writer), so
    facts of the next batch for the same runs skip the RocksDB read and JSON parse.
    Catch-up and replay use it; the live loop does not (its memory stays flat).
    """

    def __init__(self, store: PartitionStore, *, carry: bool = False) -> None:
        self.store = store
        self._before: dict[str, RunState | None] = {}
        self._after: dict[str, RunState | None] = {}
        self._keys: set[tuple[str, str]] = set()
        # Every fact staged since the last flush with its encoded bytes, in staging order.
        self._staged: list[tuple[FactHeader, bytes]] = []
        self._carry = carry
        self._carried: dict[str, RunState] = {}

    def run(self, run_id: str) -> RunState | None:
        if run_id in self._after:
            return self._after[run_id]
        state = self._carried.get(run_id)
        if state is None:
            state = self.store.run(run_id)
        self._before[run_id] = state
        self._after[run_id] = state
        return state

    def load(self, run_ids: Iterable[str]) -> None:
        """Stage the stored state of every run not staged yet, with one multi-get.

        The same as calling ``run`` for each id, so a later ``run`` finds them staged.
        """
        after, carried = self._after, self._carried
        missing = []
        for run_id in dict.fromkeys(run_ids):
            if run_id in after:
                continue
            state = carried.get(run_id)
            if state is None:
                missing.append(run_id)
            else:
                self._before[run_id] = after[run_id] = state
        for run_id, state in zip(missing, self.store.runs(missing), strict=True):
            self._before[run_id] = after[run_id] = state

    def _key_exists(self, run_id: str, fact_key: str) -> bool:
        return (run_id, fact_key) in self._keys or self.store.has_fact_key(run_id, fact_key)

    def append(
        self, run_id: str, expected_version: int, facts: tuple[FactHeader, ...]
    ) -> list[StagedFact]:
        """Conditionally append decided facts; return those actually appended, encoded."""
        if not facts:
            return []
        state = self.run(run_id)
        current = state.version if state is not None else 0
        fresh = plan_append(
            facts, expected_version, current, lambda key: self._key_exists(run_id, key)
        )
        return [self.fold(fact, encode(fact)) for fact in fresh]

    def fold(self, fact: FactHeader, encoded: bytes) -> StagedFact:
        """Fold one fact (decided now, or read back from the log) into the staged run."""
        state = self.run(fact.run_id)
        self._after[fact.run_id] = reduce(state, fact)
        self._keys.add((fact.run_id, fact.fact_key))
        self._staged.append((fact, encoded))
        return StagedFact(fact, encoded)

    def fold_read(self, facts: Sequence[tuple[FactHeader, bytes]]) -> None:
        """``fold`` each (fact, encoded bytes) read back from the log, in order.

        The runs are staged first with one multi-get (``load``); then each run's
        facts are folded together, building its next projection once per batch
        (runs are independent, so this equals folding the facts one at a time).
        """
        by_run: dict[str, list[FactHeader]] = {}
        for fact, _ in facts:
            run_facts = by_run.get(fact.run_id)
            if run_facts is None:
                by_run[fact.run_id] = [fact]
            else:
                run_facts.append(fact)
        self.load(by_run)
        after, fact_keys = self._after, self._keys
        for run_id, run_facts in by_run.items():
            after[run_id] = fold(run_facts, after[run_id])
            fact_keys.update([(run_id, fact.fact_key) for fact in run_facts])
        self._staged.extend(facts)

    @property
    def facts(self) -> list[StagedFact]:
        """The facts staged since the last flush, in order."""
        return [StagedFact(fact, encoded) for fact, encoded in self._staged]

    @property
    def dirty(self) -> bool:
        return bool(self._staged)

    def flush(self, facts_offset: int | None) -> None:
        """Write the staged changes (and the facts offset) in one WriteBatch, then clear."""
        batch = self.store.batch()
        batch.put_staged_facts(self._staged)
        for run_id, after in self._after.items():
            before = self._before.get(run_id)
            if after is not None and after is not before:
                batch.put_run(after)
                _write_index_changes(batch, before, after)
        if facts_offset is not None:
            batch.set_facts_offset(facts_offset)
        self.store.write(batch)
        carried = (
            {run_id: state for run_id, state in self._after.items() if state is not None}
            if self._carry
            else {}
        )
        self.discard()
        self._carried = carried

    def discard(self) -> None:
        self._before.clear()
        self._after.clear()
        self._keys.clear()
        self._staged.clear()
        self._carried = {}


def _write_index_changes(batch: StoreBatch, before: RunState | None, after: RunState) -> None:
    old, new = due_entries(before), due_entries(after)
    for entry in old - new:
        batch.delete_due(entry)
    for entry in new - old:
        batch.put_due(entry)
    if after.idempotency_key is not None and before is None:
        batch.put_claim(after.idempotency_key, after.run_id, after.fingerprint)
