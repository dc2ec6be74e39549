"""Garbage fed to every processor input topic goes to admission.rejected; nothing stops.

Each refused record must reappear in admission.rejected with the expected reason,
its original key and bytes exactly, and its source topic, partition and offset.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from processor.clients.client import Client, new_submit
from processor.config.settings import Settings
from processor.engine.host import Host
from processor.facts.codec import encode
from processor.facts.models import (
    RunOutcome,
    RunSucceeded,
    SegmentResult,
    StepOutput,
)
from processor.facts.payload import derive_run_id, dumps
from processor.facts.topics import TopicName
from processor.transport.base import Outbound, Producer, Reader, Record, TopicPartition
from processor.transport.deployment import Deployment
from processor.transport.partitioner import partition_for
from tests.apps.pipelines import app, expected_steps3_result
from tests.apps.support import LoopHarness, RejectedWatch, find_produced, run_facts, wait_until


@dataclass
class Running:
    """An in-process processor (with one worker) and clients of its log."""

    deployment: Deployment
    host: Host
    producer: Producer
    reader: Reader
    client: Client
    rejected: RejectedWatch

    def produce(self, topic: TopicName, key: str, value: bytes | None) -> Record:
        """Produce one record to the key's partition; return it as committed."""
        name = self.deployment.topology.name(topic)
        tp = TopicPartition(name, partition_for(key.encode(), self.deployment.topology.partitions))
        start = self.reader.end_offset(tp)
        self.producer.produce(Outbound(name, key.encode(), value, partition=tp.partition))  # type: ignore[arg-type]
        self.producer.flush()
        record = find_produced(self.reader, tp, start, value)  # type: ignore[arg-type]
        assert record is not None
        return record

    def succeeded(self, run_id: str) -> RunSucceeded | None:
        facts = run_facts(self.reader, self.deployment, run_id)
        return next((f for f in facts if isinstance(f, RunSucceeded)), None)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    deployment = Deployment.from_settings(Settings(data_dir=tmp_path / "data"))
    host = Host(deployment, app, workers=1)
    host.start()
    reader = deployment.transport.reader()
    client = Client(deployment.transport, deployment.topology, deployment.settings.state_dir)
    producer = deployment.transport.producer()
    try:
        yield Running(deployment, host, producer, reader, client, RejectedWatch(reader, deployment))
    finally:
        host.stop()
        producer.close()
        client.close()
        reader.close()


def _result(run_id: str, *, segment: int, attempt: int, generation: int) -> SegmentResult:
    return SegmentResult(
        result_id=str(uuid.uuid4()),
        run_id=run_id,
        segment=segment,
        attempt=attempt,
        generation=generation,
        steps=(StepOutput(step=0, output=b'{"forged":true}'),),
        outcome="failed",
        failed_step=1,
        error="forged",
        error_type="Forged",
        worker_id="intruder",
    )


def test_garbage_on_every_input_is_rejected_and_the_processor_keeps_going(
    running: Running,
) -> None:
    # A valid keyed run first: the idempotency conflict and the stale results refer to it.
    idem_key = f"order-{uuid.uuid4()}"
    original = new_submit("steps3", {"n": 5}, idempotency_key=idem_key)
    running.produce(TopicName.COMMANDS, original.run_id, encode(original))
    wait_until(lambda: running.succeeded(original.run_id), 60, "the keyed run to succeed")
    before = running.client.stored_status(original.run_id)
    assert before is not None
    assert before.status == "succeeded"

    valid_submit = encode(new_submit("steps3", {"n": 1}))
    outcome = RunOutcome(
        run_id="r-1", pipeline="steps3", status="succeeded", submitted_ms=1, finished_ms=2
    )
    unknown_fingerprint = b"\xc3\x01" + bytes.fromhex("0123456789abcdef") + valid_submit[10:]
    unknown_pipeline = new_submit("no_such_pipeline", {"n": 1})
    bad_json = new_submit("steps3", {"n": 1}).model_copy(update={"input": b"{not json"})
    forged_id = new_submit("steps3", {"n": 1}, idempotency_key="k-1").model_copy(
        update={"run_id": str(uuid.uuid4())}
    )
    assert forged_id.run_id != derive_run_id("k-1")
    conflict = new_submit("steps3", {"n": 6}, idempotency_key=idem_key)
    stale_old = _result(original.run_id, segment=1, attempt=1, generation=1)
    stale_unknown = _result(original.run_id, segment=1, attempt=9, generation=9)
    unknown_run = _result(str(uuid.uuid4()), segment=1, attempt=1, generation=1)

    # (topic, key, value, expected reason, expected run id in the rejection)
    cases: list[tuple[TopicName, str, bytes | None, str, str | None]] = [
        (TopicName.COMMANDS, "garbage", b"\x00\xffnot avro at all\n", "malformed", None),
        (TopicName.COMMANDS, "empty", b"", "malformed", None),
        (TopicName.COMMANDS, "tombstone", None, "malformed", None),
        (TopicName.COMMANDS, "truncated", valid_submit[:-3], "malformed", None),
        (TopicName.COMMANDS, "trailing", valid_submit + b"\x00", "malformed", None),
        (TopicName.COMMANDS, "r-1", encode(outcome), "wrong_schema", None),
        (TopicName.COMMANDS, "who", unknown_fingerprint, "unknown_schema", None),
        (
            TopicName.COMMANDS,
            unknown_pipeline.run_id,
            encode(unknown_pipeline),
            "unknown_pipeline",
            unknown_pipeline.run_id,
        ),
        (
            TopicName.COMMANDS,
            bad_json.run_id,
            encode(bad_json),
            "invalid_input",
            bad_json.run_id,
        ),
        (
            TopicName.COMMANDS,
            forged_id.run_id,
            encode(forged_id),
            "invalid_command",
            forged_id.run_id,
        ),
        (
            TopicName.COMMANDS,
            conflict.run_id,
            encode(conflict),
            "idempotency_conflict",
            original.run_id,
        ),
        (TopicName.RESULTS, "garbage", b"\xc3\x01\x00", "malformed", None),  # header cut short
        (TopicName.RESULTS, "cmd", valid_submit, "wrong_schema", None),
        (
            TopicName.RESULTS,
            original.run_id,
            encode(stale_old),
            "stale_attempt",
            original.run_id,
        ),
        (
            TopicName.RESULTS,
            original.run_id,
            encode(stale_unknown),
            "stale_attempt",
            original.run_id,
        ),
        (
            TopicName.RESULTS,
            unknown_run.run_id,
            encode(unknown_run),
            "unknown_run",
            unknown_run.run_id,
        ),
    ]
    produced = [(running.produce(topic, key, value), *rest) for topic, key, value, *rest in cases]

    # A valid run submitted after all of that still goes through.
    after = new_submit("steps3", {"n": 42})
    running.produce(TopicName.COMMANDS, after.run_id, encode(after))
    done = wait_until(lambda: running.succeeded(after.run_id), 60, "the run after the garbage")
    assert json.loads(done.result) == expected_steps3_result(42)

    for source, reason, run_id in produced:
        rejected = wait_until(
            lambda s=source: running.rejected.find(s), 30, f"rejection of {source.key!r}"
        )
        assert (rejected.reason, rejected.run_id) == (reason, run_id), source.key
        assert rejected.original_value == source.value, source.key
        assert rejected.original_key == source.key, source.key
        assert rejected.source_topic == source.topic, source.key
        assert rejected.source_partition == source.partition, source.key
        assert rejected.source_offset == source.offset, source.key
        assert rejected.rejected_ms > 0
    # Exactly one rejection per bad record: the valid runs were not refused.
    assert len(running.rejected.refresh()) == len(cases)

    # The refused conflict and stale results left the keyed run exactly as it was.
    now = running.client.stored_status(original.run_id)
    assert now is not None
    assert (now.status, now.version, now.result) == ("succeeded", before.version, before.result)
    assert running.host.errors == []
    assert all(thread.is_alive() for thread in running.host._threads)


def test_stale_result_does_not_change_a_running_run(harness: LoopHarness) -> None:
    """A result for another attempt is refused while the real attempt is in flight."""
    run_id = harness.submit("patient", {"wait": True})
    (item,) = harness.drive(harness.new_work, "the attempt is dispatched")
    client = Client(
        harness.deployment.transport,
        harness.deployment.topology,
        harness.deployment.settings.state_dir,
    )
    before = client.stored_status(run_id)
    assert before is not None
    assert (before.status, before.phase, before.attempt.generation) == ("running", "dispatched", 1)
    facts_before = harness.facts(run_id)

    for generation, attempt in ((2, 2), (0, 1), (1, 2)):
        forged = SegmentResult(
            result_id=str(uuid.uuid4()),
            run_id=run_id,
            segment=1,
            attempt=attempt,
            generation=generation,
            steps=(StepOutput(step=0, output=b'"forged"'),),
            outcome="completed",
            worker_id="intruder",
        )
        source = harness.produce_model(TopicName.RESULTS, run_id, forged)
        rejected = harness.drive(lambda s=source: harness.rejected.find(s), "the refusal")
        assert (rejected.reason, rejected.run_id) == ("stale_attempt", run_id)
        assert rejected.original_value == source.value
        now = client.stored_status(run_id)
        assert now == before
        assert harness.facts(run_id) == facts_before

    # The real attempt still completes, with its own output, not the forged one.
    harness.complete(item)
    harness.drive(
        lambda: any(isinstance(f, RunSucceeded) for f in harness.facts(run_id)), "success"
    )
    done = client.stored_status(run_id)
    assert done is not None
    assert done.status == "succeeded"
    assert done.result == dumps({"wait": True})

    # A duplicate delivery of the real result, after the end, is stale too.
    duplicate = harness.complete(item)
    rejected = harness.drive(lambda: harness.rejected.find(duplicate), "the duplicate refusal")
    assert rejected.reason == "stale_attempt"
    assert client.stored_status(run_id) == done
    client.close()


def test_submit_on_the_wrong_partition_is_forwarded_not_lost(running: Running) -> None:
    """A producer that partitions differently does not lose or duplicate the run."""
    command = new_submit("steps3", {"n": 3})
    partitions = running.deployment.topology.partitions
    right = partition_for(command.run_id.encode(), partitions)
    wrong = (right + 1) % partitions
    name = running.deployment.topology.name(TopicName.COMMANDS)
    running.producer.produce(
        Outbound(name, command.run_id.encode(), encode(command), partition=wrong)
    )
    running.producer.flush()
    done = wait_until(lambda: running.succeeded(command.run_id), 60, "the forwarded run")
    assert json.loads(done.result) == expected_steps3_result(3)
    facts = run_facts(running.reader, running.deployment, command.run_id)
    assert [f.seq for f in facts] == list(range(1, len(facts) + 1))
