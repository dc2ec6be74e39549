"""Generated bad records on every input topic, while valid runs flow (both transports).

``PROCESSOR_FUZZ_RECORDS`` records per input topic (500 by default; 10000 for the
full form) from ``tests.fuzz.records``, seeded by ``PROCESSOR_FUZZ_SEED`` (printed;
set it to replay a failure). Then:

- zero crashes: the host's threads are alive, none failed, and no input met a bug
  (no ``internal_error`` rejection);
- every record that ``records.py`` says must be refused is in admission.rejected
  with a reason and its exact bytes, named at the partition where it was decided
  (a message about a run produced to another partition is forwarded to its run's
  and refused there, under the run id as key); each trigger record the trigger
  mapping refuses is there too, at its exact position;
- nothing else is there: valid submits (with the run's key, an empty key, the key of
  another partition: forwarded), valid trigger records and identical replays of
  admitted completions were not refused;
- every valid run succeeded, and ``replay --verify`` passes: what the inputs left in
  runs.facts folds to the live state.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from processor.clients.client import new_submit
from processor.config.settings import Settings
from processor.facts.codec import encode
from processor.facts.models import CancelRun, Rejected, SubmitRun
from processor.facts.topics import TopicName
from processor.restore.replay import replay
from processor.transport.partitioner import partition_for
from processor.worker.trigger import BUILTIN_DECODERS, TriggerRecord, trigger_submit
from tests.apps.pipelines import expected_steps3_result
from tests.apps.support import RejectedWatch, read_topic, wait_until
from tests.apps.trigger_pipelines import ORDERS
from tests.fuzz.records import TRIGGER, Expect, Fuzzed, World, generate
from tests.fuzz.support import Fuzzing, fuzz_app, fuzz_records, fuzz_seed, fuzzing

INPUT_TOPICS = (
    TopicName.COMMANDS,
    TopicName.RESULTS,
    TopicName.COMPLETIONS,
    TopicName.CHECKPOINTS,
    TopicName.EVENTS,
)
SENTINEL = b"fuzz-sentinel"
#: A valid steps3 submit after every this many generated records.
VALID_EVERY = 40


@pytest.mark.parametrize(
    "kind",
    [
        "embedded",
        pytest.param("kafka", marks=pytest.mark.kafka),
        pytest.param("kafka+registry", marks=pytest.mark.kafka),
    ],
)
def test_fuzzed_inputs_are_refused_and_valid_runs_succeed(kind: str, tmp_path: Path) -> None:
    n, seed = fuzz_records(), fuzz_seed()
    print(f"fuzzing {kind}: {n} records per topic, PROCESSOR_FUZZ_SEED={seed}")
    with fuzzing(kind, tmp_path / "data") as fz:
        started = time.monotonic()
        world, warm_runs = _warm_up(fz)
        generated, valid = _produce(fz, world, n, seed)
        sentinels = _sentinels(fz, generated)
        produced_s = time.monotonic() - started
        trigger_refused, trigger_runs = _trigger_oracle(fz)
        expected_runs = {**valid, **trigger_runs}

        watch = RejectedWatch(fz.reader, fz.deployment)
        wanted = sum(1 for _, f in generated if f.expect is Expect.REFUSED) + len(trigger_refused)

        def settled() -> bool:
            outcomes = fz.refresh_outcomes()
            if fz.host.errors:  # a crash: fail now, not at the deadline
                pytest.fail(f"seed {seed}: the host failed: {fz.host.errors}")
            seen = watch.refresh()
            last = {
                (r.source_topic, r.source_partition) for r in seen if r.original_key == SENTINEL
            }
            return (
                last >= sentinels
                and len(seen) >= wanted
                and expected_runs.keys() <= outcomes.keys()
            )

        wait_until(settled, 120 + n / 20, f"seed {seed}: every refusal and every valid run")
        elapsed = time.monotonic() - started

        # Zero crashes.
        assert fz.host.errors == [], seed
        assert all(thread.is_alive() for thread in fz.host._threads), seed
        bugs = [r for r in watch.seen if r.reason == "internal_error"]
        assert bugs == [], f"seed {seed}: inputs met a bug: {[r.detail for r in bugs[:3]]}"

        # Every valid run succeeded, with the result its input says.
        for run_id, number in expected_runs.items():
            outcome = fz.outcomes[run_id]
            assert outcome.status == "succeeded", (seed, run_id, outcome)
            if number is not None:
                assert json.loads(outcome.result or b"null") == expected_steps3_result(number)
        assert {r: fz.outcomes[r].status for r in warm_runs} == dict.fromkeys(
            warm_runs, "succeeded"
        )

        # Every refusal is there, and nothing else.
        unmatched = _match(fz, generated, trigger_refused, watch.seen, seed)
        assert unmatched == [], f"seed {seed}: rejections of no bad record: {unmatched[:3]}"

        # What the fuzzed inputs left in runs.facts folds to the live state: no fact
        # is poison to a restore.
        deployment = fz.deployment
        report = replay(
            deployment.transport,
            deployment.topology,
            deployment.settings.state_dir,
            verify=True,
            processes=1,
        )
        assert (report.verified, report.differences) == (True, []), seed

        reasons = Counter(r.reason for r in watch.seen)
        print(
            f"{kind}: {n} records/topic x {len(INPUT_TOPICS) + 1} topics, seed {seed}: "
            f"produced in {produced_s:.1f}s, all settled in {elapsed:.1f}s; "
            f"{len(expected_runs)} valid runs succeeded; replay verified {report.facts} facts; "
            f"{len(watch.seen)} rejections: "
            + ", ".join(f"{reason} {count}" for reason, count in reasons.most_common())
        )


def _warm_up(fz: Fuzzing) -> tuple[World, list[str]]:
    """Two scalar runs answered by the test and a steps3 run, all over: the generator
    forges results for them and replays their completions."""
    commands = fz.name(TopicName.COMMANDS)
    scalar = [new_submit("scalar", {"n": i}) for i in range(2)]
    steps = new_submit("steps3", {"n": 1})
    for command in (*scalar, steps):
        fz.produce(commands, command.run_id.encode(), encode(command))
    fz.producer.flush()
    completions = fz.answer_awaits({c.run_id for c in scalar})
    runs = [c.run_id for c in (*scalar, steps)]
    wait_until(lambda: set(runs) <= fz.refresh_outcomes().keys(), 60, "the warm-up runs")
    world = World(
        fz.partitions,
        fz.keys,
        finished_runs=runs,
        admitted_completions=completions,
        frame=fz.confluent_frame(),
    )
    return world, runs


def _produce(
    fz: Fuzzing, world: World, n: int, seed: int
) -> tuple[list[tuple[str, Fuzzed]], dict[str, int | None]]:
    """Produce the generated records of every topic, interleaved, with valid submits
    among them; return them (by physical topic) and the valid runs (run id -> n)."""
    topics = {fz.name(t): generate(t.value, n, seed, world) for t in INPUT_TOPICS}
    topics[fz.prefix + ORDERS] = generate(TRIGGER, n, seed, world)
    generated: list[tuple[str, Fuzzed]] = []
    valid: dict[str, int | None] = {}
    commands = fz.name(TopicName.COMMANDS)
    for i in range(n):
        for topic, records in topics.items():
            record = next(records)
            fz.produce(topic, record.key, record.value, record.partition, record.headers)
            generated.append((topic, record))
        if i % VALID_EVERY == 0:
            command = new_submit("steps3", {"n": i})
            valid[command.run_id] = i
            key = _valid_key(command, i, fz.partitions)
            fz.produce(commands, key, encode(command), partition_for(key, fz.partitions))
        if i % 200 == 0:
            fz.producer.flush()
    fz.producer.flush()
    return generated, valid


def _sentinels(fz: Fuzzing, generated: list[tuple[str, Fuzzed]]) -> set[tuple[str, int]]:
    """A last bad record on every partition of every input topic: once all are refused,
    every record produced before them was read (what was not refused then never is)."""
    last = set()
    for topic in (fz.name(t) for t in INPUT_TOPICS):
        for partition in range(fz.partitions):
            value = f"fuzz-sentinel/{topic}/{partition}".encode()
            fz.produce(topic, SENTINEL, value, partition)
            on = frozenset({partition})
            generated.append(
                (
                    topic,
                    Fuzzed("sentinel", SENTINEL, value, partition, Expect.REFUSED, refused_on=on),
                )
            )
            last.add((topic, partition))
    fz.producer.flush()
    return last


def _valid_key(command: SubmitRun, i: int, partitions: int) -> bytes:
    """The run's key, an empty key, or a key of another partition (forwarded)."""
    variant = (i // VALID_EVERY) % 3
    if variant == 0:
        return command.run_id.encode()
    if variant == 1:
        return b""
    right = partition_for(command.run_id.encode(), partitions)
    return next(
        key
        for key in (f"k{j}".encode() for j in range(100))
        if partitions == 1 or partition_for(key, partitions) != right
    )


def _trigger_oracle(
    fz: Fuzzing,
) -> tuple[dict[tuple[int, int], bytes | None], dict[str, int | None]]:
    """What the trigger mapping does with each record of the user topic: the refused ones
    by position (their bytes), the runs of the others (run id -> n)."""
    (trigger,) = [t for name, t in fuzz_app(fz.prefix).triggers if name == "steps3"]
    decoder = BUILTIN_DECODERS["json"](Settings())
    refused: dict[tuple[int, int], bytes | None] = {}
    runs: dict[str, int | None] = {}
    for r in read_topic(fz.reader, fz.prefix + ORDERS, fz.partitions):
        rec = TriggerRecord(r.topic, r.partition, r.offset, r.key, r.value)
        command = trigger_submit("steps3", trigger, decoder, rec, 0)
        if isinstance(command, SubmitRun):
            runs[command.run_id] = json.loads(command.input)["n"]
        else:
            refused[(r.partition, r.offset)] = r.value
    return refused, runs


def _match(
    fz: Fuzzing,
    generated: list[tuple[str, Fuzzed]],
    trigger_refused: dict[tuple[int, int], bytes | None],
    seen: list[Rejected],
    seed: int,
) -> list[Rejected]:
    """Pair each refused record with its rejection (failing on a missing one); return the
    rejections left over."""
    user_topic = fz.prefix + ORDERS
    pool: dict[tuple[str, bytes | None], list[Rejected]] = defaultdict(list)
    left: list[Rejected] = []
    for rejection in seen:
        assert rejection.reason, (seed, rejection)
        if rejection.source_topic == user_topic:
            position = (rejection.source_partition, rejection.source_offset)
            assert position in trigger_refused, (seed, "a trigger record refused", rejection)
            assert rejection.original_value == trigger_refused.pop(position), (seed, rejection)
        else:
            pool[(rejection.source_topic, rejection.original_value)].append(rejection)
    assert trigger_refused == {}, (seed, "trigger records not refused", len(trigger_refused))
    # Records whose rejection may be on one partition first: an ambiguous one never takes
    # the rejection a definite one needs.
    refused = [(t, f) for t, f in generated if f.expect is Expect.REFUSED]
    refused.sort(key=lambda item: len(item[1].refused_on))
    for topic, fuzzed in refused:
        candidates = pool.get((topic, fuzzed.value), [])
        found = next((r for r in candidates if _refusal_of(fuzzed, r)), None)
        assert found is not None, (seed, "not refused", topic, fuzzed.kind, _shown(fuzzed.value))
        candidates.remove(found)
    for rejections in pool.values():
        left.extend(rejections)
    not_refused = {(t, f.value) for t, f in generated if f.expect is Expect.NOT_REFUSED}
    assert not [r for r in left if (r.source_topic, r.original_value) in not_refused], seed
    return left


def _refusal_of(fuzzed: Fuzzed, rejection: Rejected) -> bool:
    """Whether ``rejection`` is where and under the key ``fuzzed``'s must be: where it
    was produced, under its key; or forwarded to its run's partition, under the run id
    (a bit-flipped record's run is not known: any)."""
    if rejection.source_partition not in fuzzed.refused_on:
        return False
    key = rejection.original_key or b""
    if rejection.source_partition == fuzzed.partition:
        return key == fuzzed.key
    return fuzzed.run_id is None or key == fuzzed.run_id.encode()


def _shown(value: bytes | None) -> bytes | None:
    return value if value is None or len(value) < 200 else value[:200] + b"..."


def test_the_generator_is_deterministic() -> None:
    from processor.facts.keyring import KeyRing

    world = World(4, KeyRing.single(b"k" * 32), finished_runs=[str(uuid.uuid4())])
    for topic in (*(t.value for t in INPUT_TOPICS), TRIGGER):
        first = list(generate(topic, 200, 7, world))
        assert first == list(generate(topic, 200, 7, world))
        assert first != list(generate(topic, 200, 8, world))


@pytest.mark.parametrize("kind", ["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def test_a_record_at_the_message_size_limit_is_refused_whole(kind: str, tmp_path: Path) -> None:
    """The largest record a producer may send (Kafka's default 1,000,000 bytes): its
    rejection carries it whole plus a reason, so it is larger still, and must not stop
    the partition."""
    with fuzzing(kind, tmp_path / "data") as fz:
        topic = fz.name(TopicName.COMMANDS)
        key = b"big"
        value = b"\xff" + b"x" * (999_000 - len(key))  # not Avro in either framing
        fz.produce(topic, key, value)
        fz.producer.flush()
        after = new_submit("steps3", {"n": 7})
        fz.produce(topic, after.run_id.encode(), encode(after))
        fz.producer.flush()
        watch = RejectedWatch(fz.reader, fz.deployment)
        found = wait_until(
            lambda: next((r for r in watch.refresh() if r.original_value == value), None),
            60,
            "the rejection of the big record",
        )
        assert (found.reason, found.original_key) == ("malformed", key)
        wait_until(lambda: after.run_id in fz.refresh_outcomes(), 60, "the run after it")
        assert fz.host.errors == []


@pytest.mark.parametrize(
    "kind",
    [
        "embedded",
        pytest.param("kafka", marks=pytest.mark.kafka),
        pytest.param("kafka+registry", marks=pytest.mark.kafka),
    ],
)
def test_a_forwarded_record_is_refused_with_its_original_bytes(kind: str, tmp_path: Path) -> None:
    """Found by the fuzzer: with a schema registry, a record of ours in the single-object
    form produced to another partition than its run's was forwarded reframed in the
    Confluent wire format, so its rejection did not carry the bytes the user sent."""
    with fuzzing(kind, tmp_path / "data") as fz:
        run_id = str(uuid.uuid4())
        cancel = CancelRun(command_id="c-1", run_id=run_id, reason="fuzz", requested_ms=1)
        value = encode(cancel)
        right = partition_for(run_id.encode(), fz.partitions)
        key = next(
            k
            for k in (f"k{j}".encode() for j in range(99))
            if partition_for(k, fz.partitions) != right
        )
        fz.produce(fz.name(TopicName.COMMANDS), key, value)
        fz.producer.flush()
        watch = RejectedWatch(fz.reader, fz.deployment)
        found = wait_until(
            lambda: next((r for r in watch.refresh() if r.run_id == run_id), None),
            60,
            "the rejection of the forwarded cancel",
        )
        assert (found.reason, found.source_partition) == ("unknown_run", right)
        assert (found.original_key, found.original_value) == (run_id.encode(), value)


@pytest.mark.parametrize("kind", ["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def test_a_refusal_that_names_a_huge_field_still_fits_a_record(kind: str, tmp_path: Path) -> None:
    """Found by the fuzzer on Kafka: a rejection larger than a producer may send
    (1,000,000 bytes by default) failed its transaction again and again, so the
    partition stopped. A refusal's detail may quote the input (an unknown pipeline's
    600 kB name: carried twice), and a rejection carries the key twice (its own and
    ``original_key``): a record just under the limit must still be refused whole."""
    with fuzzing(kind, tmp_path / "data") as fz:
        command = new_submit("steps3", {"n": 1}).model_copy(update={"pipeline": "p" * 600_000})
        value = encode(command)
        fz.produce(fz.name(TopicName.COMMANDS), command.run_id.encode(), value)
        big_key, garbage = random.Random(3).randbytes(450_000), b"\xff" * 500_000
        fz.produce(fz.name(TopicName.RESULTS), big_key, garbage)
        after = new_submit("steps3", {"n": 2})
        fz.produce(fz.name(TopicName.COMMANDS), after.run_id.encode(), encode(after))
        fz.producer.flush()
        watch = RejectedWatch(fz.reader, fz.deployment)
        found = wait_until(
            lambda: next((r for r in watch.refresh() if r.run_id == command.run_id), None),
            60,
            "the rejection of the huge pipeline name",
        )
        assert (found.reason, found.original_value) == ("unknown_pipeline", value)
        assert len(found.detail) <= 2000
        keyed = wait_until(
            lambda: next((r for r in watch.refresh() if r.original_key == big_key), None),
            60,
            "the rejection of the huge key",
        )
        assert (keyed.reason, keyed.original_value) == ("malformed", garbage)
        wait_until(lambda: after.run_id in fz.refresh_outcomes(), 60, "the run after it")
        assert fz.host.errors == []
