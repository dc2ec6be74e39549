"""The layers of DESIGN.md hold, and the check would notice a back-edge."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _copy_of_package(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "processor", tmp_path / "processor", symlinks=True)
    return tmp_path


def test_the_package_keeps_its_layers() -> None:
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("module", "back_edge"),
    [
        ("facts/keys.py", "import processor.model.state"),
        ("model/state.py", "import processor.facts.tokens\nimport processor.admission.admit"),
        ("store/keys.py", "import processor.engine.loop"),
        ("transport/base.py", "import processor.clients.client"),
    ],
)
def test_a_back_edge_breaks_the_layers(tmp_path: Path, module: str, back_edge: str) -> None:
    tree = _copy_of_package(tmp_path)
    target = tree / "processor" / module
    target.write_text(target.read_text() + "\n" + back_edge + "\n")
    result = _lint_imports(tree)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout


@pytest.mark.parametrize("forbidden", ["time", "os", "confluent_kafka", "rocksdict"])
def test_the_pure_core_may_not_touch_the_outside(tmp_path: Path, forbidden: str) -> None:
    tree = _copy_of_package(tmp_path)
    target = tree / "processor" / "model" / "reduce.py"
    target.write_text(target.read_text() + f"\nimport {forbidden}\n")
    result = _lint_imports(tree)
    assert result.returncode != 0
    assert f"processor.model is not allowed to import {forbidden}" in result.stdout


def test_the_registry_client_is_imported_only_where_it_is_used() -> None:
    """The Schema Registry client and its HTTP stack cost ~0.4 s of every start; only a
    deployment with a registry (or an ``avro`` trigger) imports them."""
    probe = (
        "import sys, processor.cli, processor.engine.host, processor.engine.trigger\n"
        "print(sorted(m for m in sys.modules if m.startswith('confluent_kafka.schema_registry')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"
