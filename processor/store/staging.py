"""The open batch of one partition: decisions folded in memory until the commit.

Decide reads through the staged runs, so several inputs for one run in one batch
see each other's facts. After the log transaction commits, ``flush`` writes every
change in one WriteBatch together with the facts offset; after an abort,
``discard`` forgets it all.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from processor.facts.codec import encode
from processor.facts.models import FactHeader
from processor.model.decision import Folded
from processor.model.due import due_entries
from processor.model.journal import plan_append
from processor.model.listing import index_entries
from processor.model.reduce import fold, journal_facts, reduce
from processor.model.state import RunState
from processor.store.census import RunCensus
from processor.store.rocks import PartitionStore, StoreBatch

__all__ = ["StagedFact", "Staging"]


@dataclass(frozen=True, slots=True)
class StagedFact:
    fact: FactHeader
    encoded: bytes


class Staging:
    """Pending projection changes of one partition store.

    Runs written by a ``flush`` may be kept in memory (they equal the store's rows,
    as long as this staging is the store's only writer), so that facts of a later
    batch for the same runs skip the RocksDB read and JSON parse:

    - ``carry``: the runs of the last flush only (catch-up and replay, which meet a
      run's facts in consecutive batches);
    - ``keep_runs``: up to this many of the most recently written runs that have not
      ended (the live loop, where a run's next input comes a few batches later; an
      ended run expects none); the least recently written go first, so memory stays
      bounded.

    ``census``, if given, is told each written run's state before and after.
    """

    def __init__(
        self,
        store: PartitionStore,
        *,
        carry: bool = False,
        keep_runs: int = 0,
        census: RunCensus | None = None,
    ) -> None:
        self.store = store
        self.census = census
        self._before: dict[str, RunState | None] = {}
        self._after: dict[str, RunState | None] = {}
        self._keys: set[tuple[str, str]] = set()
        self._stored_keys: dict[str, set[str]] = {}  # fact keys read from the store, by run
        # Every fact staged since the last flush with its encoded bytes, in staging order.
        self._staged: list[tuple[FactHeader, bytes]] = []
        self._carry = carry
        self._keep_runs = keep_runs
        self._carried: dict[str, RunState] = {}
        # The journal's fact keys of carried runs whose keys were read: a later batch
        # checks its appends against them instead of reading the run's whole history.
        self._carried_keys: dict[str, set[str]] = {}
        # The earliest due time among the timers the flushes wrote since it was taken
        # (``take_earliest_due``): the loop fires a timer when it is due, not at a scan.
        self._earliest_due: int | None = None

    def run(self, run_id: str) -> RunState | None:
        if run_id in self._after:
            return self._after[run_id]
        state = self._carried.get(run_id)
        if state is None:
            state = self.store.run(run_id)
        self._before[run_id] = state
        self._after[run_id] = state
        return state

    def staged_runs(self) -> list[RunState]:
        """The runs read or changed since the last flush, as staged now."""
        return [state for state in self._after.values() if state is not None]

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
        if (run_id, fact_key) in self._keys:
            return True
        stored = self._stored_keys.get(run_id)
        if stored is None:
            stored = self._carried_keys.get(run_id)
            if stored is None:
                stored = self.store.fact_keys(run_id)
            self._stored_keys[run_id] = stored
        return fact_key in stored

    def append(
        self,
        run_id: str,
        expected_version: int,
        facts: tuple[FactHeader, ...],
        folded: Folded | None = None,
    ) -> list[StagedFact]:
        """Conditionally append decided facts; return those actually appended, encoded.

        ``folded`` is the run before ``facts`` and after them, as their decider folded
        them: when it decided on this staging's very run and every fact is appended
        as it is, the run after them is the run's next state, and the facts are not
        folded a second time.
        """
        if not facts:
            return []
        state = self.run(run_id)
        current = state.version if state is not None else 0
        fresh = plan_append(
            facts, expected_version, current, lambda key: self._key_exists(run_id, key)
        )
        # Encode and fold everything before changing anything, so that a fact that
        # raises (a bug) leaves the staging as it was: the input is refused whole.
        staged = [StagedFact(fact, encode(fact)) for fact in fresh]
        if folded is not None and folded.base is state and _unchanged(fresh, facts):
            after: dict[str, RunState | None] = {run_id: folded.after}
        else:
            after = {fact.run_id: self.run(fact.run_id) for fact in fresh}
            for fact in fresh:
                after[fact.run_id] = reduce(after[fact.run_id], fact)
        self._after.update(after)
        self._keys.update((fact.run_id, fact.fact_key) for fact in fresh)
        self._staged.extend((s.fact, s.encoded) for s in staged)
        return staged

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
        Duplicates (``journal_facts``) change nothing and are not staged.
        """
        by_run: dict[str, list[tuple[FactHeader, bytes]]] = {}
        for fact, encoded in facts:
            run_facts = by_run.get(fact.run_id)
            if run_facts is None:
                by_run[fact.run_id] = [(fact, encoded)]
            else:
                run_facts.append((fact, encoded))
        self.load(by_run)
        after, fact_keys, staged = self._after, self._keys, self._staged
        for run_id, read in by_run.items():
            new = journal_facts([fact for fact, _ in read], after[run_id])
            after[run_id] = fold(new, after[run_id])
            fact_keys.update([(run_id, fact.fact_key) for fact in new])
            staged.extend(read if len(new) == len(read) else _pairs_of(new, read))

    @property
    def facts(self) -> list[StagedFact]:
        """The facts staged since the last flush, in order."""
        return [StagedFact(fact, encoded) for fact, encoded in self._staged]

    @property
    def dirty(self) -> bool:
        return bool(self._staged)

    def flush(self, facts_offset: int | None, *, wal: bool = True) -> int:
        """Write the staged changes (and the facts offset) in one WriteBatch, then clear;
        return how many runs it wrote for the first time (runs that began).

        ``wal``: as ``PartitionStore.write`` (catch-up writes without the log)."""
        batch = self.store.batch()
        _write_history(batch, self._staged)
        started = 0
        for run_id, after in self._after.items():
            before = self._before.get(run_id)
            if after is not None and after is not before:
                batch.put_run(after)
                self._note_due(_write_due_changes(batch, before, after))
                _write_index_changes(batch, before, after)
                started += before is None
                if self.census is not None:
                    self.census.change(before, after)
        if facts_offset is not None:
            batch.set_facts_offset(facts_offset)
        self.store.write(batch, wal=wal)
        carried = self._kept_after_flush()
        carried_keys = self._keys_after_flush(carried)
        self.discard()
        self._carried, self._carried_keys = carried, carried_keys
        return started

    def _note_due(self, due_ms: int | None) -> None:
        if due_ms is not None and (self._earliest_due is None or due_ms < self._earliest_due):
            self._earliest_due = due_ms

    def take_earliest_due(self) -> int | None:
        """The earliest due time of the timers written since the last call (None: none)."""
        earliest, self._earliest_due = self._earliest_due, None
        return earliest

    def _kept_after_flush(self) -> dict[str, RunState]:
        written = {run_id: state for run_id, state in self._after.items() if state is not None}
        if self._carry:
            return written
        if not self._keep_runs:
            return {}
        kept = self._carried
        for run_id, state in written.items():
            kept.pop(run_id, None)  # re-inserted last: the most recently written
            if not state.terminal:  # an ended run expects no input: read if one comes
                kept[run_id] = state
        for run_id in list(itertools.islice(kept, max(0, len(kept) - self._keep_runs))):
            del kept[run_id]
        return kept

    def _keys_after_flush(self, carried: dict[str, RunState]) -> dict[str, set[str]]:
        """The journal's fact keys of each carried run whose keys were read: what was
        read plus what this flush wrote."""
        known = {
            run_id: keys
            for run_id in carried
            if (keys := self._stored_keys.get(run_id)) is not None
        }
        for run_id, fact_key in self._keys:
            if run_id in known:
                known[run_id].add(fact_key)
        return known

    def discard(self) -> None:
        self._before.clear()
        self._after.clear()
        self._keys.clear()
        self._stored_keys.clear()
        self._staged.clear()
        self._carried = {}
        self._carried_keys = {}


def _unchanged(fresh: Sequence[FactHeader], facts: Sequence[FactHeader]) -> bool:
    """Whether ``plan_append`` appends ``facts`` as they are: none a duplicate, none
    renumbered (it returns the very facts then)."""
    return len(fresh) == len(facts) and all(a is b for a, b in zip(fresh, facts, strict=True))


def _pairs_of(
    facts: Sequence[FactHeader], pairs: Sequence[tuple[FactHeader, bytes]]
) -> list[tuple[FactHeader, bytes]]:
    """The (fact, encoded) pairs of ``facts``, in their order."""
    encoded_of = {id(fact): encoded for fact, encoded in pairs}
    return [(fact, encoded_of[id(fact)]) for fact in facts]


def _write_history(batch: StoreBatch, staged: Sequence[tuple[FactHeader, bytes]]) -> None:
    """One history chunk per run with the run's staged facts, in journal order."""
    by_run: dict[str, list[tuple[FactHeader, bytes]]] = {}
    for fact, encoded in staged:
        by_run.setdefault(fact.run_id, []).append((fact, encoded))
    for run_id, run_facts in by_run.items():
        batch.put_history(run_id, run_facts[0][0].seq, [encoded for _, encoded in run_facts])


def _write_due_changes(batch: StoreBatch, before: RunState | None, after: RunState) -> int | None:
    """Write the run's timer changes; the earliest due time of those it added."""
    old, new = due_entries(before), due_entries(after)
    for entry in old - new:
        batch.delete_due(entry)
    earliest = None
    for entry in new - old:
        batch.put_due(entry)
        if earliest is None or entry.due_ms < earliest:
            earliest = entry.due_ms
    return earliest


def _write_index_changes(batch: StoreBatch, before: RunState | None, after: RunState) -> None:
    old, new = index_entries(before), index_entries(after)
    for entry in old - new:
        batch.delete_index(entry)
    for entry in new - old:
        batch.put_index(entry)
