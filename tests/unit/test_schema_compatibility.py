"""Schemas stay backward compatible: data written with any earlier schema decodes.

Every version of every ``.avsc`` file in git history must either equal the
current schema or be kept in ``schemas/history/<Name>.<fingerprint>.avsc`` (so
the processor can still find the writer schema of old facts), and data written
with it must decode with the current reader schema.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from io import BytesIO
from pathlib import Path
from typing import Any

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.errors import FactDecodeError
from processor.facts.codec import SCHEMA_DIR, Codec, codec, crc64_avro
from processor.facts.models import FACT_TYPES, MESSAGE_TYPES, AvroModel, SubmitRun
from tests.unit.test_codec import strategy_for

REPO = Path(__file__).resolve().parents[2]
MODELS = {m.__name__: m for m in (*FACT_TYPES, *MESSAGE_TYPES)}


def _fingerprint(schema: Any) -> bytes:
    parsed = fastavro.parse_schema(schema)
    return crc64_avro(fastavro.schema.to_parsing_canonical_form(parsed).encode())


def _committed_versions(path: Path) -> list[Any]:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: schema history unavailable")
    relative = path.resolve().relative_to(REPO.resolve()).as_posix()
    commits = subprocess.run(
        ["git", "log", "--format=%H", "--", relative],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    versions = []
    for commit in commits:
        shown = subprocess.run(
            ["git", "show", f"{commit}:{relative}"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
        )
        if shown.returncode == 0:
            versions.append(json.loads(shown.stdout))
    return versions


def _write_single_object(schema: Any, record: dict[str, Any]) -> bytes:
    out = BytesIO()
    out.write(b"\xc3\x01" + _fingerprint(schema))
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def _check_old_data_decodes(old_schema: Any, model: type[AvroModel]) -> None:
    fields = {f["name"]: strategy_for(f["type"]) for f in old_schema["fields"]}

    @given(st.fixed_dictionaries(fields))
    @settings(max_examples=25)
    def check(record: dict[str, Any]) -> None:
        decoded = codec().decode(_write_single_object(old_schema, record))
        assert isinstance(decoded, model)
        for name, value in record.items():
            if name in model.model_fields:
                got = getattr(decoded, name)
                assert _plain(got) == value

    check()


def _plain(value: Any) -> Any:
    """Model values as the plain Avro records fastavro reads and writes."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, AvroModel):
        return {k: _plain(v) for k, v in value.__dict__.items()}
    return value


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_committed_version_is_kept_and_decodes(name: str) -> None:
    current_path = SCHEMA_DIR / f"{name}.avsc"
    current = _fingerprint(json.loads(current_path.read_text()))
    for old in _committed_versions(current_path):
        fingerprint = _fingerprint(old)
        if fingerprint == current:
            continue
        kept = SCHEMA_DIR / "history" / f"{name}.{fingerprint.hex()}.avsc"
        assert kept.exists(), f"copy the previous {name} schema to {kept} to keep old data readable"
        _check_old_data_decodes(old, MODELS[name])


def test_history_schemas_resolve_to_the_current_ones() -> None:
    for path in sorted((SCHEMA_DIR / "history").glob("*.avsc")):
        name, fingerprint_hex, _ = path.name.split(".")
        old = json.loads(path.read_text())
        assert _fingerprint(old).hex() == fingerprint_hex, f"{path.name}: wrong fingerprint in name"
        _check_old_data_decodes(old, MODELS[name])


def test_codec_decodes_values_written_with_a_kept_older_schema(tmp_path: Path) -> None:
    """An older SubmitRun without idempotency_key, kept in history, still decodes."""
    for path in SCHEMA_DIR.glob("*.avsc"):
        shutil.copy(path, tmp_path / path.name)
    old = json.loads((SCHEMA_DIR / "SubmitRun.avsc").read_text())
    old["fields"] = [f for f in old["fields"] if f["name"] != "idempotency_key"]
    (tmp_path / "history").mkdir()
    (tmp_path / "history" / f"SubmitRun.{_fingerprint(old).hex()}.avsc").write_text(json.dumps(old))
    record = {"command_id": "c", "run_id": "r", "pipeline": "p", "input": b"{}", "submitted_ms": 7}
    decoded = Codec(tmp_path).decode(_write_single_object(old, record))
    assert decoded == SubmitRun(**record, idempotency_key=None)
    with pytest.raises(FactDecodeError):
        codec().decode(_write_single_object(old, record))  # without the history entry: unknown


def test_every_model_has_a_schema_file_and_every_schema_a_model() -> None:
    files = {p.stem for p in SCHEMA_DIR.glob("*.avsc")}
    assert files == set(MODELS)
