"""docs/CONTRACT.md's worked example, run as written against a real run on Kafka.

The Python block between ``<!-- contract-example:python -->`` and
``<!-- /contract-example -->`` is extracted and run in a subprocess that must not
import anything from ``processor``: it reads the JSON request of a ``payments``
await and answers with a JSON completion; the run then finishes with its payload.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from processor.clients.client import Client
from processor.engine.host import Host
from processor.facts.codec import codec
from processor.facts.models import BoundaryCompletionAdmitted
from processor.facts.topics import TopicName
from processor.worker.pipeline import Application, Pipeline
from tests.apps.support import REPO_ROOT, run_facts
from tests.kafka.support import KafkaSpace, assert_replay_verifies

pytestmark = pytest.mark.kafka

CONTRACT = REPO_ROOT / "docs" / "CONTRACT.md"
_EXAMPLE = re.compile(
    r"<!-- contract-example:python -->\s*```python\n(.*?)```\s*<!-- /contract-example -->", re.S
)
# Appended to the example: it fails if anything of this package was imported.
_NOTHING_OF_OURS = """
import sys as _sys
_ours = sorted(m for m in _sys.modules if m == "processor" or m.startswith("processor."))
assert not _ours, _ours
print("answered without processor")
"""

checkout = Pipeline("contract_checkout")


@checkout.await_step(target="payments", timeout_s=120, wire="json")
def capture(order: dict[str, Any]) -> dict[str, Any]:
    return {"amount": order["total"]}


@checkout.step()
def confirm(capture_result: dict[str, Any]) -> dict[str, Any]:
    return {"paid": capture_result["payment_id"]}


app = Application([checkout])


def contract_example() -> str:
    """The marked Python block of docs/CONTRACT.md (exactly one)."""
    (code,) = _EXAMPLE.findall(CONTRACT.read_text())
    return code


@pytest.fixture(autouse=True)
def _codec_mode() -> Iterator[None]:
    """A registry makes this process's codec read the Confluent framing; not for later tests."""
    before = codec().read_confluent
    yield
    codec().read_confluent = before


@pytest.fixture(params=["single-object", "registry"])
def framed_space(request: pytest.FixtureRequest, space: KafkaSpace) -> KafkaSpace:
    """The space, without and with the Schema Registry (the JSON wire works with both)."""
    if request.param == "single-object":
        return space
    return replace(space, schema_registry_url=request.getfixturevalue("schema_registry_url"))


@pytest.fixture
def host(framed_space: KafkaSpace, tmp_path: Path) -> Iterator[Host]:
    running = Host(framed_space.deployment(tmp_path / "data"), app, workers=1)
    running.start()
    try:
        yield running
    finally:
        running.stop()
    assert not running.errors, running.errors


def test_the_example_imports_only_confluent_kafka_and_the_standard_library() -> None:
    imports = set(re.findall(r"^(?:from|import) (\S+)", contract_example(), re.M))
    assert imports == {"json", "os", "confluent_kafka"}, imports


def test_the_contract_example_answers_a_json_await_and_the_run_continues(
    framed_space: KafkaSpace, host: Host, tmp_path: Path
) -> None:
    space = framed_space
    deployment = host.deployment
    topology = deployment.topology
    client = Client(deployment.transport, topology, deployment.settings.state_dir)
    try:
        run_id = client.submit("contract_checkout", {"total": 42}, wait_s=60).run_id
        script = tmp_path / "answer.py"
        script.write_text(contract_example() + _NOTHING_OF_OURS)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PROCESSOR_")}
        env.pop("PYTHONPATH", None)
        env |= {
            "BOOTSTRAP": space.bootstrap,
            "REQUESTS_TOPIC": topology.name(TopicName.REQUESTS),
            "COMPLETIONS_TOPIC": topology.name(TopicName.COMPLETIONS),
            "GROUP": f"{space.tag}-payments",
        }
        answered = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert answered.returncode == 0, answered.stderr
        assert answered.stdout.strip() == "answered without processor"
        result = client.wait(run_id, timeout_s=60)
        assert result.status == "succeeded", result
        assert result.output == {"paid": "pay-42"}
        reader = deployment.transport.reader()
        try:
            facts = run_facts(reader, deployment, run_id)
        finally:
            reader.close()
        (admitted,) = [f for f in facts if isinstance(f, BoundaryCompletionAdmitted)]
        assert json.loads(admitted.payload) == {"payment_id": "pay-42"}
    finally:
        client.close()
    host.stop()
    assert_replay_verifies(space, tmp_path / "data")  # the wire is no part of the facts
