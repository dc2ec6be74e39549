"""Shell completion of the installed ``processor`` command (typer's, on bash)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.wheel_support import user_env

#: The console script pip installed next to this interpreter, as a user runs it.
PROCESSOR = Path(sys.executable).with_name("processor")


def _processor(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    assert PROCESSOR.is_file(), f"no {PROCESSOR}: install the package (make .venv)"
    return subprocess.run(
        [str(PROCESSOR), *args],
        env=user_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_completion_options_are_offered() -> None:
    shown = _processor("--help")
    assert shown.returncode == 0, shown.stderr
    assert "--install-completion" in shown.stdout
    assert "--show-completion" in shown.stdout


def test_show_completion_prints_the_bash_script() -> None:
    # typer finds the user's shell among the command's parents (shellingham), so the
    # command runs from bash, as a user types it (two commands: bash does not exec it).
    shown = subprocess.run(
        ["bash", "-c", '"$0" --show-completion; exit $?', str(PROCESSOR)],
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert "_PROCESSOR_COMPLETE=complete_bash" in shown.stdout
    assert shown.stdout.rstrip().endswith("processor")  # complete ... -F _... processor


def test_bash_completes_command_names_and_options() -> None:
    def completions(line: str) -> list[str]:
        words = line.split(" ")
        done = _processor(
            _PROCESSOR_COMPLETE="complete_bash",
            COMP_WORDS=line,
            COMP_CWORD=str(len(words) - 1),
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    assert completions("processor sta") == ["status"]
    assert {"redrive", "replay"} <= set(completions("processor re"))
    assert "--idempotency-key" in completions("processor submit orders --")
