"""kill -9 ``processor run`` at random moments of a workload mixing an async step, a
durable sleep, a heartbeating step and a step that fails now and then.

The test submits ``RUNS`` runs of ``tests.apps.mixed_pipelines`` in chunks and kills
the processor once per chunk, at a moment of a kind the seeded RNG picks the order
of: while a heartbeating step runs, while runs sleep, right after it reports that
it runs (often while restoring), or after a random amount of committed progress.
Then it checks the journal: every run ended exactly once (one terminal fact, one
outcome on runs.results), the runs whose step never failed beyond its retry
budget succeeded and no kill was charged to a retry budget (every failure is the
step's own), each sleep fired once, every lost attempt shows in ``processor
status`` as an infrastructure loss, and ``replay --verify`` agrees with the live
projections.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import partial

import pytest

from processor.clients.client import Client, new_submit
from processor.facts.codec import codec, decode_fact
from processor.facts.models import (
    AttemptLost,
    AttemptStepStarted,
    DeadLetter,
    FactHeader,
    RunFailed,
    RunOutcome,
    RunStopped,
    RunSucceeded,
    SegmentFailed,
    SleepCompleted,
    SleepStarted,
    StepCompleted,
)
from processor.facts.topics import TopicName
from processor.transport.deployment import ensure_topics
from tests.apps.mixed_pipelines import (
    CRUNCH_STEP,
    SETTLE_RETRY,
    HiccupError,
    doomed,
    expected_result,
)
from tests.apps.support import TopicTail, read_topic, wait_until
from tests.faults.crash_env import CrashEnv

pytestmark = pytest.mark.slow

SEED = 20_261_202
RUNS = 80
#: One kill per chunk of runs but the last; the RNG shuffles their order.
MOMENTS = ("heartbeating", "heartbeating", "sleeping", "at start", "progress")
TERMINAL = (RunSucceeded, RunFailed, RunStopped)
SETTLE_STEP = CRUNCH_STEP + 1
OWN_ERROR = HiccupError.__name__


@dataclass
class Journal:
    """What the test has read of runs.facts so far."""

    tail: TopicTail
    ended: set[str] = field(default_factory=set)
    #: Runs asleep, with their wake times (epoch ms).
    asleep: dict[str, int] = field(default_factory=dict)
    #: Runs whose ``crunch`` step a worker reported started (and not yet done).
    crunching: set[str] = field(default_factory=set)

    def sleeping(self, after_ms: int) -> int:
        """How many runs sleep past ``after_ms`` (their wake is still ahead)."""
        return sum(1 for wake_ms in self.asleep.values() if wake_ms > after_ms)

    def refresh(self) -> None:
        for record in self.tail.new():
            fact = decode_fact(record.value)
            run_id = fact.run_id
            match fact:
                case AttemptStepStarted(step=step) if step == CRUNCH_STEP:
                    self.crunching.add(run_id)
                case StepCompleted(step=step) if step == CRUNCH_STEP:
                    self.crunching.discard(run_id)
                case AttemptLost() | SegmentFailed():
                    self.crunching.discard(run_id)
                case SleepStarted(wake_ms=wake_ms):
                    self.asleep[run_id] = wake_ms
                case SleepCompleted():
                    self.asleep.pop(run_id, None)
                case RunSucceeded() | RunFailed() | RunStopped():
                    self.ended.add(run_id)
                    self.crunching.discard(run_id)


def test_kill_9_during_a_mixed_workload_ends_every_run_once(crash_env: CrashEnv) -> None:
    process, deployment = crash_env.process, crash_env.deployment
    process.app = "tests.apps.mixed_pipelines:app"
    ensure_topics(deployment)
    topology = deployment.topology
    client = Client(deployment.transport, topology, deployment.settings.state_dir)
    reader = deployment.transport.reader()
    journal = Journal(TopicTail(reader, topology.name(TopicName.FACTS), topology.partitions))
    rng = random.Random(SEED)
    moments = list(MOMENTS)
    rng.shuffle(moments)
    inputs: dict[str, int] = {}
    kills: list[str] = []

    def submit(count: int) -> None:
        for _ in range(count):
            command = new_submit("mixed", {"n": len(inputs)})
            inputs[command.run_id] = len(inputs)
            client.send(command)
        client.flush()

    def reached(moment: str, target: int) -> bool:
        process.check_alive()
        journal.refresh()
        if moment == "heartbeating":
            return bool(journal.crunching)
        if moment == "sleeping":  # with some time left to kill it in
            return journal.sleeping(_now_ms() + 200) > 0
        return journal.tail.end_total() >= target

    try:
        process.start()
        chunks = _chunks(RUNS, len(moments) + 1)
        for moment, chunk in zip(moments, chunks, strict=False):
            submit(chunk)
            journal.refresh()
            journal.crunching.clear()  # only a step started in this round counts
            target = journal.tail.end_total() + rng.randint(1, 3 * chunk)
            if moment == "at start":
                process.wait_running()
            else:
                wait_until(partial(reached, moment, target), 60, moment, max_pause_s=0.01)
            journal.refresh()
            kills.append(
                f"{moment}: {len(inputs) - len(journal.ended)} runs in flight, "
                f"{len(journal.crunching)} crunching, {journal.sleeping(_now_ms())} asleep"
            )
            assert process.kill() == -9
            print(f"kill {len(kills)} ({crash_env.transport}) {kills[-1]}")
            process.start()
        submit(chunks[-1])

        def all_ended() -> bool:
            process.check_alive()
            journal.refresh()
            return journal.ended >= inputs.keys()

        wait_until(all_ended, 90, "every run to end", max_pause_s=0.2)
        assert process.stop() == 0

        def records(topic: TopicName) -> list[bytes]:
            found = read_topic(reader, topology.name(topic), topology.partitions)
            return [r.value for r in found if r.value is not None]

        facts = [decode_fact(value) for value in records(TopicName.FACTS)]
        outcomes = [codec().decode_as(v, RunOutcome) for v in records(TopicName.OUTCOMES)]
        dead = [codec().decode_as(value, DeadLetter) for value in records(TopicName.DLQ)]
    finally:
        client.close()
        reader.close()

    by_run = _by_run(facts, inputs)
    for run_id, run in by_run.items():
        _assert_ended_as_expected(run_id, inputs[run_id], run)
    failures = [f for f in facts if isinstance(f, SegmentFailed)]
    charged = [(f.run_id, f.error_type, f.error) for f in failures if f.error_type != OWN_ERROR]
    assert charged == [], f"failures not of the step's own making: {charged[:5]}; {kills}"
    assert failures, "no step failed: the retries went untested"

    expected = {r: "failed" if doomed(n) else "succeeded" for r, n in inputs.items()}
    assert Counter(o.run_id for o in outcomes) == Counter(dict.fromkeys(inputs, 1))
    assert {o.run_id: o.status for o in outcomes} == expected
    assert sorted(d.run_id for d in dead) == sorted(r for r, s in expected.items() if s == "failed")

    _assert_losses_shown(crash_env, by_run, kills)

    verify = crash_env.cli("replay", "--verify", "--json")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    report = json.loads(verify.stdout)
    assert report["verified"] is True, report["differences"]
    assert (report["facts"], report["runs"]) == (len(facts), RUNS)


def _now_ms() -> int:
    return int(time.time() * 1000)  # the processor's clock: wake times are epoch ms


def _chunks(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _by_run(facts: list[FactHeader], inputs: dict[str, int]) -> dict[str, list[FactHeader]]:
    """The facts of each run; no fact key twice in a run, sequence numbers gapless."""
    by_run: dict[str, list[FactHeader]] = defaultdict(list)
    for fact in facts:
        by_run[fact.run_id].append(fact)
    assert by_run.keys() == inputs.keys(), "facts of unknown runs, or runs without facts"
    keys = Counter((f.run_id, f.fact_key) for f in facts)
    assert [k for k, count in keys.items() if count > 1] == [], "fact keys appended twice"
    for run_id, run in by_run.items():
        assert [f.seq for f in run] == list(range(1, len(run) + 1)), run_id
    return by_run


def _of(run: list[FactHeader], kind: type[FactHeader]) -> list[FactHeader]:
    return [f for f in run if isinstance(f, kind)]


def _assert_ended_as_expected(run_id: str, n: int, run: list[FactHeader]) -> None:
    """One terminal fact, last; a doomed run failed of its own step, any other succeeded."""
    terminal = [f for f in run if isinstance(f, TERMINAL)]
    assert len(terminal) == 1 and run[-1] is terminal[0], (run_id, terminal)
    [started] = _of(run, SleepStarted)
    [woke] = _of(run, SleepCompleted)
    assert isinstance(started, SleepStarted) and isinstance(woke, SleepCompleted)
    assert woke.wake_ms == started.wake_ms <= woke.time_ms, run_id
    end = terminal[0]
    if not doomed(n):
        assert isinstance(end, RunSucceeded), (run_id, n, end)
        assert json.loads(end.result) == expected_result(run_id, n)
        return
    assert isinstance(end, RunFailed), (run_id, n, end)
    budget = SETTLE_RETRY.max_attempts
    shown = (end.error_type, end.reason, end.step, end.attempts)
    assert shown == (OWN_ERROR, "attempts_exhausted", SETTLE_STEP, budget), run_id


def _losses(run: list[FactHeader]) -> list[FactHeader]:
    """The run's infrastructure losses: attempts lost, steps started again elsewhere."""
    return [
        f
        for f in run
        if isinstance(f, AttemptLost) or (isinstance(f, AttemptStepStarted) and f.redelivered)
    ]


def _assert_losses_shown(
    crash_env: CrashEnv, by_run: dict[str, list[FactHeader]], kills: list[str]
) -> None:
    """Some kill lost an attempt; ``processor status`` counts each loss of a run.

    Which fact records a loss is a race, and either is right: the attempt's heartbeat
    timer fires (``AttemptLost``) unless the restarted in-process worker takes its
    item back and starts it again first (a redelivered ``AttemptStepStarted``).
    """
    lost = {r: _losses(run) for r, run in by_run.items() if _losses(run)}
    print(f"{sum(map(len, lost.values()))} infrastructure losses in {len(lost)} runs")
    assert lost, f"no kill lost an attempt: {kills}"
    for run_id, losses in lost.items():
        for count, loss in enumerate(losses, 1):
            if isinstance(loss, AttemptLost):  # a heartbeat stopped: crunch's worker was killed
                assert (loss.cause, loss.losses, loss.step) == (
                    "heartbeat_timeout",
                    count,
                    CRUNCH_STEP,
                ), run_id
    unharmed = next(r for r in by_run if r not in lost)
    for run_id in [*sorted(lost)[:2], unharmed]:
        shown = crash_env.cli("status", run_id, "--json")
        assert shown.returncode == 0, shown.stdout + shown.stderr
        status = json.loads(shown.stdout)
        assert status["infrastructure_losses"] == len(lost.get(run_id, [])), (run_id, status)
        assert status["status"] in ("succeeded", "failed"), status
