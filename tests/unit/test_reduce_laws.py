"""Laws of the fold: duplicates are no-ops, and persisting mid-way changes nothing."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processor.facts.codec import encode
from processor.facts.models import FactHeader
from processor.model.decision import Folded
from processor.model.reduce import fold, reduce
from processor.model.state import RunState
from processor.store.rocks import PartitionStore
from processor.store.staging import Staging
from tests.unit.simulation import Simulation

Event = tuple[str, int, int, bool]

events = st.lists(
    st.tuples(
        st.sampled_from(["submit", "ok", "fail", "fail_final", "tick"]),
        st.integers(0, 5),  # which run
        st.integers(0, 3),  # progress before failing / ms multiplier
        st.booleans(),  # keyed submit
    ),
    max_size=60,
)


def simulate(script: list[Event]) -> Simulation:
    sim = Simulation()
    runs: list[str] = []
    for kind, which, amount, keyed in script:
        if kind == "submit":
            runs.append(sim.submit(f"k{which}" if keyed else None, value=which))
        elif kind == "tick":
            sim.advance(amount * 400 + 1)
        elif runs:
            run_id = runs[which % len(runs)]
            state = sim.states[run_id]
            if state.phase == "dispatched" and not state.terminal:
                sim.result(run_id, fail=kind != "ok", progress=amount, retryable=kind == "fail")
    sim.advance(10_000)
    return sim


def by_run(facts: list[FactHeader]) -> dict[str, list[FactHeader]]:
    grouped: dict[str, list[FactHeader]] = {}
    for fact in facts:
        grouped.setdefault(fact.run_id, []).append(fact)
    return grouped


@given(events)
def test_folding_twice_equals_folding_once(script: list[Event]) -> None:
    sim = simulate(script)
    for run_id, facts in by_run(sim.facts).items():
        once = fold(facts)
        assert once == sim.states[run_id]
        assert fold(facts, once) == once
        twice = None
        for fact in facts:
            twice = reduce(reduce(twice, fact), fact)
        assert twice == once


@given(events, st.data())
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_fold_prefix_persist_reload_fold_rest_equals_fold_all(
    tmp_path: Path, script: list[Event], data: st.DataObject
) -> None:
    sim = simulate(script)
    cut = data.draw(st.integers(0, len(sim.facts)))
    path = Path(tempfile.mkdtemp(dir=tmp_path))
    store = PartitionStore(path)
    try:
        staging = Staging(store)
        for fact in sim.facts[:cut]:
            staging.fold(fact, encode(fact))
        staging.flush(cut)
    finally:
        store.close()

    reopened = PartitionStore(path)
    try:
        assert reopened.facts_offset() == cut
        staging = Staging(reopened)
        for fact in sim.facts[cut:]:
            staging.fold(fact, encode(fact))
        staging.flush(len(sim.facts))
        for run_id, state in sim.states.items():
            assert reopened.run(run_id) == state
            assert len(reopened.history(run_id)) == state.version
    finally:
        reopened.close()


def _ended(store: PartitionStore, run_id: str) -> bool:
    state = store.run(run_id)
    return state is not None and state.terminal


@given(events, st.integers(0, 3), st.lists(st.integers(1, 8), min_size=1, max_size=20))
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_runs_kept_in_memory_between_flushes_equal_the_stored_ones(
    tmp_path: Path, script: list[Event], keep_runs: int, batch_sizes: list[int]
) -> None:
    """The live loop's staging keeps recently written runs that have not ended, and the
    journal keys of those it checked; folding through them in batches gives the store
    and the states a fold of everything gives, and the kept keys are the stored ones."""
    sim = simulate(script)
    store = PartitionStore(Path(tempfile.mkdtemp(dir=tmp_path)))
    try:
        staging = Staging(store, keep_runs=keep_runs)
        done, sizes = 0, iter(batch_sizes * (len(sim.facts) + 1))
        while done < len(sim.facts):
            batch = sim.facts[done : done + next(sizes)]
            for fact in batch:
                # As an append checks its keys: the run's journal keys are read (or taken
                # from the ones kept since the last flush).
                assert not staging._key_exists(fact.run_id, "no such key")
                staging.fold(fact, encode(fact))
            done += len(batch)
            staging.flush(done)
            written = {f.run_id for f in batch}
            open_written = {run_id for run_id in written if not _ended(store, run_id)}
            assert len(staging._carried) <= keep_runs
            if len(open_written) <= keep_runs:  # this flush's open runs are all kept
                assert open_written <= staging._carried.keys()
            for run_id, kept in staging._carried.items():
                assert kept == store.run(run_id)
                assert not kept.terminal  # a run that ended expects no input: not kept
            assert staging._carried_keys.keys() <= staging._carried.keys()
            for run_id, fact_keys in staging._carried_keys.items():
                assert fact_keys == store.fact_keys(run_id)
        for run_id, state in sim.states.items():
            assert store.run(run_id) == state
            assert staging.run(run_id) == state
    finally:
        store.close()


@given(events)
def test_a_decision_carries_the_run_its_facts_fold_into(script: list[Event]) -> None:
    sim = simulate(script)  # Simulation._take compares each decision's run with the fold
    assert sim.folded_checked > 0 or not sim.facts


def test_an_append_takes_the_deciders_run_only_if_it_appends_the_facts_as_they_are(
    tmp_path: Path,
) -> None:
    sim = Simulation()
    run_id = sim.submit()
    decision = sim.result(run_id, fail=False)
    assert decision.folded is not None and len(decision.facts) > 1
    earlier = sim.facts[: -len(decision.facts)]
    store = PartitionStore(tmp_path / "store")

    def staged() -> Staging:
        """A staging at the run the decision was decided on."""
        staging = Staging(store)
        for fact in earlier:
            staging.fold(fact, encode(fact))
        return staging

    try:
        # Decided on a run equal to the staged one, but not on that very one: folded.
        staging = staged()
        assert decision.folded.base == staging.run(run_id)
        staging.append(run_id, decision.expected_version, decision.facts, decision.folded)
        assert staging.run(run_id) is not decision.folded.after
        assert staging.run(run_id) == decision.folded.after

        # Decided on the staged run: its folded run is taken, not folded again.
        staging = staged()
        on_it = Folded(staging.run(run_id), decision.folded.after)
        staging.append(run_id, decision.expected_version, decision.facts, on_it)
        assert staging.run(run_id) is on_it.after

        # Renumbered by the append (numbered past the journal here): folded as appended.
        staging = staged()
        on_it = Folded(staging.run(run_id), decision.folded.after)
        later = tuple(f.model_copy(update={"seq": f.seq + 5}) for f in decision.facts)
        staging.append(run_id, decision.expected_version, later, on_it)
        assert staging.run(run_id) is not on_it.after
        assert staging.run(run_id) == decision.folded.after
    finally:
        store.close()


def test_unknown_fact_types_only_advance_the_version() -> None:
    sim = Simulation()
    run_id = sim.submit()
    state = sim.states[run_id]

    class FutureFact(FactHeader):
        novelty: str = "x"

    future = FutureFact(
        run_id=run_id, seq=state.version + 1, fact_key="future", time_ms=5, cause_id="c"
    )
    after = reduce(state, future)
    assert isinstance(after, RunState)
    assert after.version == state.version + 1
    assert (
        after.model_copy(update={"version": state.version, "updated_ms": state.updated_ms}) == state
    )


def test_a_run_that_ended_is_not_kept_in_memory(tmp_path: Path) -> None:
    """The live loop keeps the runs it wrote for their next input; a run that ended
    expects none, and kept ended runs filled the cache (4,096 a partition) with runs
    nobody reads: 100 MiB more at 30,000 runs (bench/memory_embedded.py)."""
    script: list[Event] = [("submit", 0, 0, False), ("submit", 1, 0, False)]
    script += [("ok", 0, 0, False)] * 12
    sim = simulate(script)
    ended, running = sorted(sim.states, key=lambda run_id: not sim.states[run_id].terminal)
    assert sim.states[ended].terminal and not sim.states[running].terminal
    store = PartitionStore(tmp_path / "store")
    try:
        staging = Staging(store, keep_runs=4)
        for fact in sim.facts:
            staging.fold(fact, encode(fact))
        staging.flush(len(sim.facts))
        assert list(staging._carried) == [running]
        assert staging.run(ended) == sim.states[ended]  # read from the store instead
    finally:
        store.close()
