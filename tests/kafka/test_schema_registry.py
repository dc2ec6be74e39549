"""The Confluent wire format through a real Schema Registry, on a real Kafka broker.

The registry is Apicurio Registry's Confluent-compatible API (compose/local-registry,
or SCHEMA_REGISTRY_URL). Checked: a run's whole story is Confluent-framed and read
by a client that imports nothing from ``processor`` (tests/kafka/interop_client.py,
run as a script), which also answers an await; both framings, older schema
versions, unknown ids and foreign records on one input topic; ``schemas apply``
and the registry's refusal; the registry stopped mid-workload.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import replace
from io import BytesIO
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from processor.clients.client import Client, new_submit
from processor.clients.schemas import apply_schemas
from processor.engine.host import Host
from processor.facts.codec import SCHEMA_DIR, codec, encode
from processor.facts.models import Rejected, RunSucceeded
from processor.facts.topics import TopicName
from processor.transport.base import Outbound, Record
from processor.transport.deployment import Deployment, ensure_topics
from processor.transport.kafka import KafkaTransport
from tests.apps import boundary_pipelines
from tests.apps.pipelines import app as pipelines_app
from tests.apps.pipelines import expected_steps3_result
from tests.apps.support import REPO_ROOT, RejectedWatch, run_facts, wait_until
from tests.kafka.support import (
    FactsWatch,
    KafkaProcessorProcess,
    KafkaSpace,
    assert_replay_verifies,
)
from tests.schema_registry import start_local_registry
from tests.web.support import request_of

pytestmark = pytest.mark.kafka

INTEROP = Path(__file__).resolve().parent / "interop_client.py"
SUBMIT_RUN = "processor.messages.SubmitRun"


@pytest.fixture(autouse=True)
def _codec_mode() -> Iterator[None]:
    """A registry makes this process's codec read the Confluent framing; not for later tests."""
    before = codec().read_confluent
    yield
    codec().read_confluent = before


@pytest.fixture
def registry_space(space: KafkaSpace, schema_registry_url: str) -> KafkaSpace:
    return replace(space, schema_registry_url=schema_registry_url)


def _interop(*args: str) -> list[dict[str, Any]]:
    """Run the processor-free client; its JSON lines."""
    result = subprocess.run(
        [sys.executable, str(INTEROP), *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def _host(space: KafkaSpace, data_dir: Path, app: Any, *, fact_batches: bool = False) -> Host:
    settings = space.settings(data_dir).model_copy(update={"fact_batches": fact_batches})
    deployment = Deployment.from_settings(settings)
    ensure_topics(deployment, [*app.output_topics, *pipelines_app.output_topics])
    return Host(deployment, app, workers=1)


@pytest.fixture
def boundary_host(
    request: pytest.FixtureRequest, registry_space: KafkaSpace, tmp_path: Path
) -> Iterator[Host]:
    """A host of the boundary pipelines; ``True`` as its parameter: with fact batches."""
    batches = bool(getattr(request, "param", False))
    running = _host(registry_space, tmp_path / "data", boundary_pipelines.app, fact_batches=batches)
    apply_schemas(running.deployment.settings)  # the external system's subject must exist
    running.start()
    try:
        yield running
    finally:
        running.stop()
    assert not running.errors, running.errors


@pytest.mark.parametrize("boundary_host", [False, True], ids=["single", "batched"], indirect=True)
def test_a_client_without_this_package_reads_a_run_and_answers_its_await(
    registry_space: KafkaSpace, boundary_host: Host
) -> None:
    deployment = boundary_host.deployment
    topology = deployment.topology
    bootstrap, registry = registry_space.bootstrap, str(registry_space.schema_registry_url)
    client = Client(deployment.transport, topology, deployment.settings.state_dir)
    reader = deployment.transport.reader()
    requests = topology.name(TopicName.REQUESTS)
    try:
        run_id = client.submit("scalar", {"n": 5}, wait_s=60).run_id
        wait_until(
            lambda: _interop("read", bootstrap, registry, requests), 60, "the await's request"
        )
        answered = _interop(
            "answer", bootstrap, registry, requests, topology.name(TopicName.COMPLETIONS)
        )
        assert answered[0]["run_id"] == run_id
        watch = FactsWatch(reader, topology)
        wait_until(lambda: watch.all_ended([run_id]), 60, "the run to end after the answer")
        facts = run_facts(reader, deployment, run_id)  # our own reader decodes them too
        assert isinstance(facts[-1], RunSucceeded)
    finally:
        client.close()
        reader.close()

    story = _interop("read", bootstrap, registry, topology.name(TopicName.FACTS))
    assert story and all(r["schema_id"] is not None for r in story)  # 00 + a registered id
    # With fact batches, the facts committed together read from one record, each fact
    # framed with its own registered id.
    batched = [r for r in story if r.get("batched")]
    assert bool(batched) is deployment.settings.fact_batches
    names = [r["record_name"] for r in story if r["value"]["run_id"] == run_id]
    assert names[0] == "processor.facts.RunSubmitted"
    assert "processor.facts.BoundaryCompletionAdmitted" in names
    assert names[-1] == "processor.facts.RunSucceeded"
    succeeded = [r["value"] for r in story if r["record_name"].endswith("RunSucceeded")]
    assert json.loads(succeeded[0]["result"]) == {"answer": {"echo": {"question": 5}}}
    request = _interop("read", bootstrap, registry, requests)[0]
    assert (request["record_name"], request["value"]["run_id"]) == (
        "processor.messages.BoundaryRequest",
        run_id,
    )
    outcomes = _interop("read", bootstrap, registry, topology.name(TopicName.OUTCOMES))
    assert [(o["value"]["run_id"], o["value"]["status"]) for o in outcomes] == [
        (run_id, "succeeded")
    ]


def test_a_sender_learns_what_became_of_its_confluent_framed_completion(
    boundary_host: Host,
) -> None:
    deployment = boundary_host.deployment
    settings = deployment.settings
    with Client(
        deployment.transport, deployment.topology, settings.state_dir, group=settings.group
    ) as client:
        run_id = client.submit("scalar", {"n": 6}, wait_s=60).run_id
        request = wait_until(lambda: request_of(deployment, run_id), 60, "the await's request")
        token = request.resume_token
        first = client.complete(token, {"ok": 1}, wait_s=60)
        again = client.complete(token, {"ok": 1}, wait_s=60)
        forged = client.complete(token[:-1] + ("A" if token[-1] != "A" else "B"), 1, wait_s=60)
        # Asked later by key: the framed fact, and the framed completion a rejection keeps.
        admitted = client.completion(run_id, first.idempotency_key)
        refused = client.completion(run_id, forged.idempotency_key)
    assert [first.admission, again.admission, forged.admission] == [
        "admitted",
        "duplicate",
        "refused",
    ]
    assert forged.refusal == "invalid_token"
    assert admitted is not None and (admitted.admission, admitted.offset) == (
        "admitted",
        first.offset,
    )
    assert refused is not None and (refused.refusal, refused.offset) == (
        "invalid_token",
        forged.offset,
    )


@pytest.fixture
def steps_host(registry_space: KafkaSpace, tmp_path: Path) -> Iterator[Host]:
    from tests.apps.pipelines import app

    running = _host(registry_space, tmp_path / "data", app)
    running.start()
    try:
        yield running
    finally:
        running.stop()
    assert not running.errors, running.errors


def _history_schema(model: str) -> str:
    """The oldest kept version of ``model``'s schema (the one with the fewest fields:
    versions only ever add optional ones)."""
    paths = sorted((SCHEMA_DIR / "history").glob(f"{model}.*.avsc"))
    assert paths, f"no older version of {model} is kept"
    texts = [path.read_text() for path in paths]
    return min(texts, key=lambda text: len(json.loads(text)["fields"]))


def _confluent(schema_id: int, schema: str, record: dict[str, Any]) -> bytes:
    out = BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(json.loads(schema)), record)
    return b"\x00" + schema_id.to_bytes(4, "big") + out.getvalue()


def test_both_framings_older_schemas_and_refusals_on_one_topic(
    registry_space: KafkaSpace, steps_host: Host
) -> None:
    deployment = steps_host.deployment
    topology = deployment.topology
    commands = topology.name(TopicName.COMMANDS)
    registry = _registry(registry_space)
    client = Client(deployment.transport, topology, deployment.settings.state_dir)
    plain = _plain_transport(deployment).producer()
    reader = deployment.transport.reader()
    confluent, single, older = (new_submit("steps3", {"n": n}) for n in (1, 2, 3))
    try:
        client.send(confluent)  # through the registry: Confluent framing
        client.flush()
        plain.produce(Outbound(commands, single.run_id.encode(), encode(single)))
        subject = f"{commands}-{SUBMIT_RUN}"
        old_id = registry.register_schema(subject, Schema(_history_schema("SubmitRun"), "AVRO"))
        record = {k: v for k, v in older.model_dump().items() if k != "deadline_ms"}
        older_value = _confluent(old_id, _history_schema("SubmitRun"), record)
        foreign_schema = json.dumps(
            {"type": "record", "name": "Order", "namespace": "com.acme", "fields": []}
        )
        foreign_id = registry.register_schema(
            f"{commands}-com.acme.Order", Schema(foreign_schema, "AVRO")
        )
        unknown_value = _confluent(2**31 - 7, _history_schema("SubmitRun"), record)
        foreign_value = b"\x00" + foreign_id.to_bytes(4, "big")
        for key, value in [
            (older.run_id, older_value),
            ("unknown", unknown_value),
            ("foreign", foreign_value),
        ]:
            plain.produce(Outbound(commands, key.encode(), value))
        plain.flush()

        runs = [confluent.run_id, single.run_id, older.run_id]
        watch = FactsWatch(reader, topology)
        wait_until(lambda: watch.all_ended(runs), 60, "the three runs to end")
        for command in (confluent, single, older):
            facts = run_facts(reader, deployment, command.run_id)
            assert isinstance(facts[-1], RunSucceeded)
            n = json.loads(command.input)["n"]
            assert json.loads(facts[-1].result) == expected_steps3_result(n)

        rejections = RejectedWatch(reader, deployment)
        wait_until(lambda: len(rejections.refresh()) >= 2, 60, "two rejections")
        found = {r.reason: r for r in rejections.refresh()}
        assert set(found) == {"unknown_schema", "wrong_schema"}, found
        assert _is(found["unknown_schema"], unknown_value, commands)
        assert _is(found["wrong_schema"], foreign_value, commands)
        firsts = {record.value[:1] for record in _raw(plain_reader(deployment), commands)}
        assert firsts == {b"\x00", b"\xc3"}  # both framings in one topic
        facts = _raw(plain_reader(deployment), topology.name(TopicName.FACTS))
        assert {record.value[:1] for record in facts} == {b"\x00"}
    finally:
        client.close()
        plain.close()
        reader.close()
        registry.close()
    steps_host.stop()
    # Restore and replay read the Confluent-framed journal into the same projections,
    # in pool processes too (the transport, registry client and all, is pickled).
    data_dir = deployment.settings.data_dir
    report = assert_replay_verifies(registry_space, data_dir, "--processes", "2")
    assert (report["runs"], report["processes"]) == (3, 2)


def _registry(space: KafkaSpace) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": str(space.schema_registry_url)})


def _plain_transport(deployment: Deployment) -> KafkaTransport:
    """The deployment's Kafka without the registry: single-object values, raw reads."""
    settings = deployment.settings.model_copy(update={"schema_registry_url": None})
    return KafkaTransport(settings)


def plain_reader(deployment: Deployment) -> Any:
    return _plain_transport(deployment).reader()


def _raw(reader: Any, topic: str) -> list[Record]:
    from tests.apps.support import read_topic

    try:
        return list(read_topic(reader, topic, 4))
    finally:
        reader.close()


def _is(rejected: Rejected, value: bytes, topic: str) -> bool:
    """The rejection keeps the record's bytes exactly as they were read."""
    return rejected.original_value == value and rejected.source_topic == topic


def _apply(space: KafkaSpace, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return space.cli(tmp_path / "cli", "schemas", "apply", *args)


def test_schemas_apply_registers_and_refuses_an_incompatible_change(
    registry_space: KafkaSpace, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    applied = _apply(registry_space, tmp_path, "--json")
    assert applied.returncode == 0, applied.stderr
    subjects = {entry["subject"]: entry for entry in json.loads(applied.stdout)}
    facts_subject = f"{registry_space.prefix}runs.facts-processor.facts.RunSubmitted"
    assert subjects[facts_subject]["compatibility"] == "BACKWARD"
    registry = _registry(registry_space)
    request.addfinalizer(registry.close)
    assert registry.get_compatibility(facts_subject) == "BACKWARD"
    again = _apply(registry_space, tmp_path, "--json")  # applying twice changes nothing
    assert json.loads(again.stdout) == json.loads(applied.stdout)

    # A subject whose history our schema cannot read (a field without default is new).
    other = replace(registry_space, tag=f"kt{uuid.uuid4().hex[:12]}")
    subject = f"{other.prefix}runs.commands-{SUBMIT_RUN}"
    narrow = {
        "type": "record",
        "name": "SubmitRun",
        "namespace": "processor.messages",
        "fields": [{"name": "run_id", "type": "string"}],
    }
    registry.register_schema(subject, Schema(json.dumps(narrow), "AVRO"))
    refused = _apply(other, tmp_path)
    assert refused.returncode != 0
    assert subject in refused.stderr and "409" in refused.stderr, refused.stderr
    assert "ncompatib" in refused.stderr  # the registry's own answer
    assert [v for v in registry.get_versions(subject)] == [1]  # nothing registered


def _free_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


@pytest.fixture
def own_registry(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A registry of this test's own (a free port, schemas kept on disk), stopped at the end."""
    env = {"LOCAL_REGISTRY_PORT": _free_port(), "LOCAL_REGISTRY_DATA": str(tmp_path / "reg")}
    url = start_local_registry(env)
    try:
        yield {"url": url, **env}
    finally:
        subprocess.run(
            [str(REPO_ROOT / "compose" / "local-registry"), "stop"],
            env={**os.environ, **env},
            capture_output=True,
            timeout=60,
            check=False,
        )


def _wait_logged(process: KafkaProcessorProcess, text: str, what: str) -> None:
    """Until the processor logs ``text``; on a timeout, say what it logged instead."""
    try:
        wait_until(lambda: text in process.log_text(), 60, what)
    except AssertionError as late:
        tail = process.log_text()[-4000:]
        raise AssertionError(f"{late}; the processor's log:\n{tail}") from late


# Alone, not beside other Kafka tests: with -n 2 it once waited in vain for the
# processor to log its first failed registration (issue 30's note).
@pytest.mark.exclusive
def test_the_registry_stopped_mid_workload_rejects_nothing(
    space: KafkaSpace, own_registry: dict[str, str], tmp_path: Path
) -> None:
    """The registry goes away while the processor has records to write in schemas it
    has not registered yet, and records to read in a schema id it has not resolved:
    it logs it and waits instead of refusing anything, and every run goes on once the
    registry is back. (No attempt is open during the outage, so no step timeout can
    fire meanwhile and refuse a late result for reasons of its own.)"""
    from tests.apps.pipelines import app

    registry_space = replace(space, schema_registry_url=own_registry["url"])
    deployment = registry_space.deployment(tmp_path / "client")
    ensure_topics(deployment, app.output_topics)
    process = KafkaProcessorProcess(registry_space, tmp_path / "proc", tmp_path / "proc.log")
    client = Client(deployment.transport, deployment.topology, deployment.settings.state_dir)
    plain = _plain_transport(deployment).producer()
    registry = SchemaRegistryClient({"url": own_registry["url"]})
    launcher = [str(REPO_ROOT / "compose" / "local-registry")]
    env = {**os.environ, **own_registry}
    topology = deployment.topology
    commands, outcomes = topology.name(TopicName.COMMANDS), topology.name(TopicName.OUTCOMES)
    bootstrap, url = registry_space.bootstrap, own_registry["url"]

    # No decoding in this process (its codec binds the ids of the shared registry):
    # the processor-free client reads instead.
    def read(topic: str) -> list[dict[str, Any]]:
        return _interop("read", bootstrap, url, topic)

    def succeeded() -> set[str]:
        return {r["value"]["run_id"] for r in read(outcomes) if r["value"]["status"] == "succeeded"}

    try:
        process.start()
        # A submit the processor refuses: it resolves SubmitRun's id, registers only
        # the rejection's schema, and starts no run.
        client.send(new_submit("no_such_pipeline", {}))
        client.flush()
        rejected_topic = topology.name(TopicName.REJECTED)
        wait_until(lambda: read(rejected_topic), 90, "the refused submit")
        # Its workers announce themselves in a schema of their own: the processor
        # resolves that id now, or it would wait on it first during the outage.
        for worker in ("w0", "w1"):
            _wait_logged(process, f"-{worker} loads", "the workers' announcements")
        subject = f"{commands}-{SUBMIT_RUN}"
        old_id = registry.register_schema(subject, Schema(_history_schema("SubmitRun"), "AVRO"))
        subprocess.run([*launcher, "stop"], env=env, capture_output=True, timeout=60, check=True)

        # Its facts need schemas not registered yet: the processor cannot write them.
        first = new_submit("steps3", {"n": 1})
        client.send(first)  # SubmitRun's id is cached: no registry needed to send it
        client.flush()
        _wait_logged(process, "schema registry: register", "a write")
        # In a schema id the processor has not resolved: it cannot read them.
        later = [new_submit("steps3", {"n": n}) for n in range(2, 5)]
        for command in later:
            record = {k: v for k, v in command.model_dump().items() if k != "deadline_ms"}
            value = _confluent(old_id, _history_schema("SubmitRun"), record)
            plain.produce(Outbound(commands, command.run_id.encode(), value))
        plain.flush()
        _wait_logged(process, f"get schema {old_id}", "a read to wait")
        assert "ConnectError" in process.log_text()  # the refused connection, logged
        subprocess.run([*launcher, "start"], env=env, capture_output=True, timeout=120, check=True)

        expected = {first.run_id, *(c.run_id for c in later)}
        wait_until(lambda: succeeded() == expected, 120, "every run to succeed after the outage")
        # Nothing refused while the registry was away: only the submit refused before.
        reasons = [r["value"]["reason"] for r in read(rejected_topic)]
        assert reasons == ["unknown_pipeline"]
        process.check_alive()
    finally:
        client.close()
        plain.close()
        registry.close()
        process.close()
