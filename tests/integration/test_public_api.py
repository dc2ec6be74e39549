"""The public API, used as the README shows it, on both transports.

A real processor host (the processor loop and two worker threads, what
``processor run`` starts) serves a small application defined with
``from processor import ...`` only; a ``Client`` built from settings submits
runs, waits for their outcomes and reads their status and history.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import processor
from processor import (
    Application,
    Client,
    NonRetryableError,
    Pipeline,
    RetryPolicy,
    Settings,
    UnknownRunError,
    WaitTimeoutError,
)
from processor.engine.host import Host
from processor.facts.models import BoundaryRequest
from processor.facts.topics import TopicName
from processor.transport.deployment import Deployment
from tests.apps.support import REPO_ROOT, TopicTail, decode_records, wait_until
from tests.kafka.support import KafkaSpace
from tests.kafka_broker import kafka_bootstrap, unavailable_reason

doubler = Pipeline("doubler", version=1)


@doubler.step(timeout_s=10, retry=RetryPolicy(max_attempts=3, initial_backoff_ms=10))
def double(value: dict[str, Any]) -> dict[str, Any]:
    return {"n": value["n"] * 2}


refuser = Pipeline("refuser", version=1)


@refuser.step(timeout_s=10)
def refuse(value: Any) -> Any:
    raise NonRetryableError(f"{value!r} is refused")


holder = Pipeline("holder", version=1)


@holder.await_step(target="nobody", timeout_s=3600)
def hold(value: Any) -> Any:
    return value  # the request for a system that never answers


asker = Pipeline("asker", version=1)


@asker.await_step(target="oracle", timeout_s=3600)
def ask(value: Any) -> Any:
    return {"question": value}


@asker.step(timeout_s=10)
def answer(reply: dict[str, Any]) -> dict[str, Any]:
    return {"answer": reply["x"]}


app = Application([doubler, refuser, holder, asker])


@pytest.fixture(params=["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Settings]:
    """The settings of a fresh deployment on the embedded log or on the test broker."""
    if request.param == "embedded":
        yield Settings(data_dir=tmp_path / "data")
        return
    bootstrap = kafka_bootstrap()
    if bootstrap is None:
        pytest.skip(unavailable_reason())
    space = KafkaSpace.new(bootstrap)
    try:
        yield space.settings(tmp_path / "data")
    finally:
        space.delete_topics()


@pytest.fixture
def client(settings: Settings) -> Iterator[Client]:
    """A client of a deployment that a processor host with two workers is serving."""
    host = Host(Deployment.from_settings(settings), app, workers=2)
    host.start()
    try:
        with Client(settings=settings) as made:
            yield made
    finally:
        host.stop()
    assert not host.errors, host.errors


def test_the_public_names_are_importable_from_the_package() -> None:
    for name in processor.__all__:
        assert getattr(processor, name) is not None, name
    assert issubclass(NonRetryableError, processor.ProcessorError)
    assert issubclass(WaitTimeoutError, processor.ProcessorError)
    assert issubclass(WaitTimeoutError, TimeoutError)
    assert issubclass(UnknownRunError, processor.ProcessorError)


def test_submit_then_wait_returns_the_output_and_status_and_history_agree(
    client: Client,
) -> None:
    receipt = client.submit("doubler", {"n": 21}, wait_s=60)
    assert receipt.created is True, receipt

    result = client.wait(receipt.run_id, timeout_s=60)

    assert result.run_id == receipt.run_id
    assert result.status == "succeeded" and result.succeeded
    assert result.output == {"n": 42}
    assert result.error is None
    state = client.status(receipt.run_id)
    assert state is not None and state.status == "succeeded"
    history = client.history(receipt.run_id)
    assert type(history[0]).__name__ == "RunSubmitted"
    assert type(history[-1]).__name__ == "RunSucceeded"
    assert [f.seq for f in history] == list(range(1, len(history) + 1))
    # A run that has ended is answered at once, from what is already in the log.
    assert client.wait(receipt.run_id, timeout_s=0) == result


def test_an_idempotent_resubmit_returns_the_same_run(client: Client) -> None:
    first = client.submit("doubler", {"n": 1}, idempotency_key="order-1", wait_s=60)
    again = client.submit("doubler", {"n": 1}, idempotency_key="order-1", wait_s=60)
    assert (first.created, again.created) == (True, False)
    assert again.run_id == first.run_id
    assert client.wait(first.run_id, timeout_s=60).output == {"n": 2}


def test_a_resubmit_with_a_relative_deadline_is_the_same_submit(client: Client) -> None:
    first = client.submit("doubler", {"n": 3}, idempotency_key="k-deadline", deadline_s=600)
    # The second call is made later, so an absolute deadline would differ from the first.
    again = client.submit("doubler", {"n": 3}, idempotency_key="k-deadline", deadline_s=600)
    assert (first.created, again.created, again.refusal) == (True, False, None)
    status = client.status(first.run_id)
    assert status is not None
    assert status.deadline_ms is not None


def test_a_failed_run_waits_to_its_error(client: Client) -> None:
    receipt = client.submit("refuser", "x", wait_s=60)
    result = client.wait(receipt.run_id, timeout_s=60)
    assert result.status == "failed" and not result.succeeded
    assert result.output is None
    assert result.error is not None and "'x' is refused" in result.error
    assert result.error_type == "NonRetryableError"


def test_a_wait_times_out_while_the_run_goes_on_and_then_sees_it_cancelled(
    client: Client,
) -> None:
    receipt = client.submit("holder", {"id": 7}, wait_s=60)
    started = time.monotonic()
    with pytest.raises(WaitTimeoutError) as timed_out:
        client.wait(receipt.run_id, timeout_s=0.5)
    waited = time.monotonic() - started
    assert timed_out.value.run_id == receipt.run_id
    assert timed_out.value.status == "running"
    assert 0.5 <= waited < 15, waited

    reply = client.cancel(receipt.run_id, "no answer coming", wait_s=60)
    assert reply is not None and reply.refusal is None, reply
    result = client.wait(receipt.run_id, timeout_s=60)
    assert result.status == "cancelled"
    assert type(client.history(receipt.run_id)[-1]).__name__ == "RunStopped"


def test_an_await_answered_through_the_client_lets_the_run_finish(
    client: Client, settings: Settings
) -> None:
    receipt = client.submit("asker", 3, wait_s=60)
    deployment = Deployment.from_settings(settings)
    topology = deployment.topology
    reader = deployment.transport.reader()
    try:
        tail = TopicTail(reader, topology.name(TopicName.REQUESTS), topology.partitions)
        requests: list[BoundaryRequest] = []

        def the_request() -> BoundaryRequest | None:
            requests.extend(decode_records(tail.new(), BoundaryRequest))
            return next((r for r in requests if r.run_id == receipt.run_id), None)

        request = wait_until(the_request, 60, "the run's boundary request")
    finally:
        reader.close()
    assert request.target == "oracle"

    client.complete(request.resume_token, {"x": 42})

    result = client.wait(receipt.run_id, timeout_s=60)
    assert result.status == "succeeded"
    assert result.output == {"answer": 42}


def test_waiting_for_an_unknown_run_is_an_error(client: Client) -> None:
    with pytest.raises(UnknownRunError, match="no run no-such-run"):
        client.wait("no-such-run", timeout_s=5)
    assert client.status("no-such-run") is None
    assert client.history("no-such-run") == []


def test_a_client_built_from_nothing_uses_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROCESSOR_DATA_DIR", str(tmp_path / "from-env"))
    host = Host(Deployment.from_settings(Settings()), app, workers=1)
    host.start()
    try:
        with Client() as client:
            receipt = client.submit("doubler", {"n": 5}, wait_s=60)
            assert client.wait(receipt.run_id, timeout_s=60).output == {"n": 10}
    finally:
        host.stop()
    assert (tmp_path / "from-env" / "log").is_dir()  # the environment's deployment, no other


def test_a_client_takes_either_settings_or_its_parts(settings: Settings) -> None:
    deployment = Deployment.from_settings(settings)
    with pytest.raises(processor.ConfigurationError):
        Client(deployment.transport)
    with pytest.raises(processor.ConfigurationError):
        Client(deployment.transport, deployment.topology, settings.state_dir, settings=settings)


#: Libraries the README's examples may use besides ``processor`` (a step calling a service).
_THIRD_PARTY = frozenset({"httpx"})


def _readme_examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (REPO_ROOT / "README.md").read_text(), re.S)


def test_the_readme_examples_import_only_the_public_api_and_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    examples = _readme_examples()
    assert len(examples) >= 4
    for code in examples:
        imports = re.findall(r"^\s*(?:from|import) (\S+)", code, re.M)
        # Of ours, only the public API; an example may call out with a well-known client.
        assert "processor" in imports and set(imports) <= {"processor", *_THIRD_PARTY}, imports
    definitions = [code for code in examples if "with Client(" not in code]
    using = [code for code in examples if "with Client(" in code]
    (submitting,) = [code for code in using if "client.submit(" in code]
    (scheduling,) = [code for code in using if "client.schedules." in code]
    spaces: list[dict[str, Any]] = [{} for _ in definitions]
    for code, space in zip(definitions, spaces, strict=True):
        exec(compile(code, "README.md", "exec"), space)

    monkeypatch.setenv("PROCESSOR_DATA_DIR", str(tmp_path / "data"))
    host = Host(Deployment.from_settings(Settings()), spaces[0]["app"], workers=1)
    host.start()
    try:
        exec(compile(submitting, "README.md", "exec"), {})
        printed = capsys.readouterr().out.splitlines()
        exec(compile(scheduling, "README.md", "exec"), {})
        scheduled = capsys.readouterr().out.splitlines()
    finally:
        host.stop()
    assert printed[0].startswith("succeeded {"), printed
    assert printed[-1].endswith(" RunSucceeded"), printed
    assert scheduled[0] == "created True", scheduled
    assert sorted(line.split()[:2] for line in scheduled[1:]) == [
        ["each-minute", "True"],
        ["weekday-order", "False"],
    ], scheduled
