"""Build the package's wheel as compose/Dockerfile and .ci/wheel-smoke do, and install it
into a fresh virtual environment: what a user gets from ``pip install``, with nothing of
the checkout around it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["BUILD_INPUTS", "REPO_ROOT", "build_wheel", "install_in_fresh_venv", "user_env"]

REPO_ROOT = Path(__file__).resolve().parents[1]
#: What a build needs; a copy keeps a stale build/ or egg-info of the checkout out of it.
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE", "processor", "schemas", "topics")


def build_wheel(root: Path) -> Path:
    """``pip wheel --no-deps`` of a clean copy of the sources, built under ``root``."""
    source = root / "src"
    source.mkdir()
    for name in BUILD_INPUTS:
        if (REPO_ROOT / name).is_dir():
            # processor/schemas and processor/topics stay links, as in a clone.
            ignore = shutil.ignore_patterns("__pycache__")
            shutil.copytree(REPO_ROOT / name, source / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(REPO_ROOT / name, source / name)
    dist = root / "dist"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", str(source), "-w", str(dist)]
    )
    (path,) = dist.glob("processor-*.whl")
    return path


def install_in_fresh_venv(wheel: Path, venv: Path) -> Path:
    """A new virtual environment at ``venv`` with ``wheel`` and its dependencies installed
    (from the package index, as a user's ``pip install`` would); returns its ``bin``."""
    _run([sys.executable, "-m", "venv", str(venv)])
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(wheel)])
    return venv / "bin"


def user_env(**settings: str) -> dict[str, str]:
    """This environment without the checkout's: no PYTHONPATH, no PROCESSOR_* but ``settings``."""
    env = {
        k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("PROCESSOR_")
    }
    return {**env, **settings}


def _run(argv: list[str]) -> None:
    done = subprocess.run(
        argv, env=user_env(), capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, f"{' '.join(argv)}:\n{done.stdout}{done.stderr}"
