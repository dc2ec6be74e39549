"""Any test file runs alone: ``pytest tests/integration/test_cli.py`` from the repository
root collects, as the whole suite does.

With pytest's default import mode, a test module inside packages (``__init__.py`` in
its folder and every folder above it up to ``tests/``) is imported by its full name,
with the repository root on ``sys.path``, so its ``from tests.apps... import`` works.
In a folder without ``__init__.py`` only that folder goes on ``sys.path``: the module
imports only because another module of the same run put the root there, and fails when
run alone (``python -m pytest`` hides it by putting the working directory there too).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.wheel_support import REPO_ROOT, user_env

TESTS = REPO_ROOT / "tests"


def _test_folders() -> list[Path]:
    """Every folder holding test modules."""
    return sorted({path.parent for path in TESTS.rglob("test_*.py")})


def test_every_test_folder_is_a_package() -> None:
    relative = [folder.relative_to(TESTS) for folder in _test_folders()]
    packages = {package for folder in relative for package in (folder, *folder.parents)}
    missing = sorted(f"tests/{f}" for f in packages if not (TESTS / f / "__init__.py").is_file())
    assert missing == []


@pytest.mark.slow  # a pytest process per folder: about a second each
@pytest.mark.parametrize("folder", _test_folders(), ids=lambda f: str(f.relative_to(TESTS)))
def test_each_test_folder_collects_alone(folder: Path) -> None:
    """As the ``pytest`` command runs it: ``-P`` keeps the working directory off
    ``sys.path``, and nothing of this run's path or settings is passed on."""
    collected = subprocess.run(
        [
            *(sys.executable, "-P", "-m", "pytest", "--collect-only", "-q"),
            *("-p", "no:cacheprovider", str(folder.relative_to(REPO_ROOT))),
        ],
        cwd=REPO_ROOT,
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
    assert " collected" in collected.stdout.splitlines()[-1], collected.stdout[-500:]
