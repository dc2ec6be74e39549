"""kill -9 a real ``processor run`` while runs wait at awaits that a responder answers.

Scalar (``approval``) and itemized (``survey``) runs of
``tests.apps.control_pipelines`` suspend at an await; a ``Responder`` thread in
this process answers boundary.requests (and sends some answers twice, identical).
The processor is killed at moments chosen by a seeded RNG and restarted each time.
At the end: every interaction was requested once and admitted exactly once, no run
is stuck (all succeed, with the answers in item order), no fact key repeats,
sequence numbers are gapless, and ``replay --verify`` agrees.
"""

from __future__ import annotations

import json
import random
import threading
from collections import Counter, defaultdict
from typing import Any

import pytest

from processor.clients.client import Client, new_submit
from processor.clients.external import CompletionClient, Responder
from processor.facts.codec import codec, decode_fact, encode
from processor.facts.models import (
    BoundaryCompletion,
    BoundaryCompletionAdmitted,
    BoundaryInteractionDispatched,
    BoundaryRequest,
    FactHeader,
    RunFailed,
    RunStopped,
    RunSucceeded,
)
from processor.facts.topics import TopicName
from processor.transport.deployment import ensure_topics
from tests.apps.control_pipelines import (
    APPROVALS,
    expected_approval_result,
    expected_survey_result,
)
from tests.apps.support import TopicTail, read_topic, wait_until
from tests.faults.crash_env import CrashEnv

pytestmark = pytest.mark.slow

SEED = 20_250_613
RUNS = 240
KILLS = 5
TERMINAL = (RunSucceeded, RunFailed, RunStopped)


def answer(request: BoundaryRequest, value: Any) -> int:
    """What the external system answers: a function of the request, so results are checkable."""
    return int(value["approve"]) * 3 + 1


def test_kill_9_while_awaits_are_answered_admits_each_interaction_once(
    crash_env: CrashEnv,
) -> None:
    processor_process = crash_env.process
    deployment = crash_env.deployment
    ensure_topics(deployment)
    topology = deployment.topology
    rng = random.Random(SEED)
    duplicated = Counter[str]()

    def send_again(
        request: BoundaryRequest, sent: BoundaryCompletion, out: CompletionClient
    ) -> None:
        # Every third answer is sent twice, byte for byte: a duplicate must be a no-op.
        if json.loads(request.request)["approve"] % 3 == 0:
            out.produce_raw(request.run_id, encode(sent))
            duplicated[request.run_id] += 1

    responder = Responder(
        deployment.transport,
        topology,
        {APPROVALS: answer},
        group="crash-responder",
        after=send_again,
    )
    stop_responder = threading.Event()
    responder_thread = threading.Thread(target=responder.run, args=(stop_responder,), daemon=True)
    client = Client(deployment.transport, topology, deployment.settings.state_dir)
    reader = deployment.transport.reader()
    facts_tail = TopicTail(reader, topology.name(TopicName.FACTS), topology.partitions)
    inputs: dict[str, tuple[str, dict[str, int]]] = {}
    ended: set[str] = set()

    def submit(count: int) -> None:
        for _ in range(count):
            n = len(inputs) + 1
            if rng.random() < 0.5:
                pipeline, value = "approval", {"n": n}
            else:
                pipeline, value = "survey", {"n": n, "items": rng.randint(1, 4)}
            command = new_submit(pipeline, value)
            inputs[command.run_id] = (pipeline, value)
            client.send(command)
        client.flush()

    def follow() -> int:
        processor_process.check_alive()
        for record in facts_tail.new():
            fact = decode_fact(record.value)
            if isinstance(fact, TERMINAL):
                ended.add(fact.run_id)
        return facts_tail.end_total()

    def all_ended() -> bool:
        follow()
        return ended >= inputs.keys()

    try:
        responder_thread.start()
        processor_process.start()
        at_start = rng.randrange(KILLS)
        kills: list[tuple[str, int]] = []
        per_round = RUNS // (KILLS + 1)
        for round_ in range(KILLS):
            submit(per_round)
            if round_ == at_start:
                processor_process.wait_running()
                when = "at start"
            else:
                # Within the round's own work (about five facts a run), so that the
                # kill lands while its runs are in flight however fast they end.
                target = follow() + rng.randint(1, 2 * per_round)
                wait_until(lambda t=target: follow() >= t, 90, f"{target} facts", 0.01)
                when = f"at {target} facts"
            follow()
            kills.append((when, len(inputs) - len(ended)))
            assert processor_process.kill() == -9
            processor_process.start()
        submit(RUNS - len(inputs))
        assert all(in_flight > 0 for when, in_flight in kills if when != "at start"), kills

        try:
            wait_until(all_ended, 90, "every run to reach a terminal record", 0.1)
        except AssertionError as exc:
            stuck = sorted(set(inputs) - ended)[:5]
            raise AssertionError(f"{exc}; stuck runs, e.g. {stuck}") from None
        assert processor_process.stop() == 0
    finally:
        stop_responder.set()
        responder_thread.join(30)
        client.close()

    try:
        facts = [
            decode_fact(r.value)
            for r in read_topic(reader, topology.name(TopicName.FACTS), topology.partitions)
        ]
        requests = [
            codec().decode_as(r.value, BoundaryRequest)
            for r in read_topic(reader, topology.name(TopicName.REQUESTS), topology.partitions)
        ]
    finally:
        reader.close()
    assert sum(duplicated.values()) > 0 and responder.answered == len(requests)
    _assert_each_interaction_once(facts, requests, inputs)

    verify = crash_env.cli("replay", "--verify", "--json")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    report = json.loads(verify.stdout)
    assert report["verified"] is True, report["differences"]
    assert (report["facts"], report["runs"]) == (len(facts), len(inputs))


def _assert_each_interaction_once(
    facts: list[FactHeader],
    requests: list[BoundaryRequest],
    inputs: dict[str, tuple[str, dict[str, int]]],
) -> None:
    by_run: dict[str, list[FactHeader]] = defaultdict(list)
    for fact in facts:
        by_run[fact.run_id].append(fact)
    assert by_run.keys() == inputs.keys()
    repeated = [k for k, n in Counter((f.run_id, f.fact_key) for f in facts).items() if n > 1]
    assert repeated == [], f"fact keys appended twice: {repeated[:5]}"

    dispatched = Counter(
        (f.run_id, f.interaction) for f in facts if isinstance(f, BoundaryInteractionDispatched)
    )
    admitted = Counter(
        (f.run_id, f.interaction) for f in facts if isinstance(f, BoundaryCompletionAdmitted)
    )
    asked = Counter((r.run_id, r.interaction) for r in requests)
    expected = {
        (run_id, f"b1.{i}")
        for run_id, (pipeline, value) in inputs.items()
        for i in range(1 if pipeline == "approval" else value["items"])
    }
    assert set(dispatched) == set(asked) == set(admitted) == expected
    assert set(dispatched.values()) == {1}
    assert set(asked.values()) == {1}, "a boundary request was published twice"
    assert set(admitted.values()) == {1}, "an interaction was admitted twice"

    for run_id, run in by_run.items():
        assert [f.seq for f in run] == list(range(1, len(run) + 1)), run_id
        terminal = [f for f in run if isinstance(f, TERMINAL)]
        assert len(terminal) == 1 and run[-1] is terminal[0], run_id
        assert isinstance(terminal[0], RunSucceeded), (run_id, terminal[0])
        pipeline, value = inputs[run_id]
        result = json.loads(terminal[0].result)
        if pipeline == "approval":
            assert result == expected_approval_result(value["n"] * 3 + 1), run_id
        else:
            answers = [(value["n"] * 100 + i) * 3 + 1 for i in range(value["items"])]
            assert result == expected_survey_result(answers), run_id
