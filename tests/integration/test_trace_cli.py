"""``processor submit --traceparent`` and ``PROCESSOR_OTEL=true`` from the command line.

No processor runs: the submit is queued (exit 3), and the command it produced is
read back from the embedded log's runs.commands.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from processor.config.settings import Settings
from processor.facts.codec import codec
from processor.facts.models import SubmitRun
from processor.facts.topics import TopicName
from processor.transport.deployment import Deployment
from tests.apps.support import REPO_ROOT, read_topic, subprocess_env

GIVEN = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _submit(data_dir: Path, *args: str, otel: bool = False) -> subprocess.CompletedProcess[str]:
    env = subprocess_env(data_dir)
    if otel:
        env["PROCESSOR_OTEL"] = "true"
    command = ["submit", "steps3", "--input", '{"n": 1}', "--wait", "0.2", *args]
    return subprocess.run(
        [sys.executable, "-m", "processor", "--data-dir", str(data_dir), "--json", *command],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _submitted(data_dir: Path) -> list[SubmitRun]:
    deployment = Deployment.from_settings(Settings(data_dir=data_dir))
    topology = deployment.topology
    reader = deployment.transport.reader()
    try:
        records = read_topic(reader, topology.name(TopicName.COMMANDS), topology.partitions)
        return [codec().decode_as(r.value, SubmitRun) for r in records]
    finally:
        reader.close()


def test_submit_sends_the_traceparent_with_the_command(tmp_path: Path) -> None:
    done = _submit(tmp_path / "data", "--traceparent", GIVEN)
    assert done.returncode == 3, done.stderr  # queued: no processor answers here
    run_id = json.loads(done.stderr)["run_id"]  # the error names the queued run
    (command,) = _submitted(tmp_path / "data")
    assert (command.run_id, command.traceparent) == (run_id, GIVEN)


def test_a_malformed_traceparent_is_a_usage_error_and_sends_nothing(tmp_path: Path) -> None:
    done = _submit(tmp_path / "data", "--traceparent", "00-not-a-trace-01")
    assert done.returncode == 2
    assert "not a W3C traceparent" in json.loads(done.stderr)["error"]
    assert not (tmp_path / "data").exists() or _submitted(tmp_path / "data") == []


def test_with_otel_on_the_submit_span_is_exported_and_is_the_runs_parent(tmp_path: Path) -> None:
    done = _submit(tmp_path / "data", "--traceparent", GIVEN, otel=True)
    assert done.returncode == 3, done.stderr
    # Without an OTLP exporter installed, the SDK's console exporter prints to stderr,
    # as the command prints its error (queued).
    (span,) = [shown for shown in _json_objects(done.stderr) if "name" in shown]
    assert span["name"] == "processor.submit"
    assert span["context"]["trace_id"] == "0x" + GIVEN.split("-")[1]
    assert span["parent_id"] == "0x" + GIVEN.split("-")[2]
    (command,) = _submitted(tmp_path / "data")
    assert command.traceparent is not None and command.traceparent != GIVEN
    assert command.traceparent.split("-")[1] == GIVEN.split("-")[1]
    assert "0x" + command.traceparent.split("-")[2] == span["context"]["span_id"]


def _json_objects(text: str) -> list[dict[str, Any]]:
    """The JSON objects printed in ``text`` (each may span several lines), in order."""
    found, decoder, at = [], json.JSONDecoder(), text.find("{")
    while at != -1:
        shown, end = decoder.raw_decode(text, at)
        found.append(shown)
        at = text.find("{", end)
    return found
