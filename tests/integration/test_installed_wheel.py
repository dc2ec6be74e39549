"""The wheel installed in a fresh virtual environment, used from a user's own folder with
nothing of the checkout around it.

``--app shop:app`` finds ``shop.py`` in the folder the command runs in, as uvicorn,
celery and flask find theirs (the ``processor`` script puts its own folder on the path,
not the working directory); and /docs shows with what the wheel and its dependencies
install, nothing fetched from elsewhere."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.apps.support import wait_until
from tests.web.support import assert_docs_offline
from tests.wheel_support import build_wheel, install_in_fresh_venv, user_env

pytestmark = pytest.mark.slow  # builds the wheel and installs it with its dependencies

SHOP = """
from processor import Application, Pipeline

orders = Pipeline("orders")


@orders.step()
def confirm(order):
    return {**order, "confirmed": True}


app = Application([orders])
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``bin`` folder of a fresh virtual environment holding the built wheel."""
    root = tmp_path_factory.mktemp("wheel")
    return install_in_fresh_venv(build_wheel(root), root / "venv")


@pytest.fixture
def shop(tmp_path: Path) -> Path:
    """A user's folder holding ``shop.py`` (and the embedded log, in ``data/``)."""
    folder = tmp_path / "shop"
    folder.mkdir()
    (folder / "shop.py").write_text(SHOP)
    return folder


class Command:
    """One ``processor`` command started in the shop's folder (stderr kept in a file)."""

    def __init__(self, installed: Path, shop: Path, *args: str, **settings: str) -> None:
        self._stderr_path = shop / f"{args[0]}.stderr"
        self._stderr = self._stderr_path.open("w")
        self.proc = subprocess.Popen(
            [str(installed / "processor"), *args],
            cwd=shop,
            env=user_env(PROCESSOR_DATA_DIR=str(shop / "data"), **settings),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put("")  # the end of stdout: the command exited

    def first_line(self, timeout_s: float = 90.0) -> dict[str, Any]:
        """The JSON line the command prints first on stdout (its ready line)."""
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"no line on stdout in {timeout_s}s") from None
        if not line:
            code = self.proc.wait(30)
            raise AssertionError(f"exited {code}: {self._stderr_path.read_text()}")
        shown: dict[str, Any] = json.loads(line)
        return shown

    def stop(self) -> int:
        """SIGTERM (unless it has exited), wait, and release its pipes."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
            raise
        finally:
            self._reader.join(30)
            assert self.proc.stdout is not None
            self.proc.stdout.close()
            self._stderr.close()


@pytest.fixture
def started(installed: Path, shop: Path) -> Iterator[list[Command]]:
    commands: list[Command] = []
    try:
        yield commands
    finally:
        for command in commands:
            command.stop()


def _cli(installed: Path, shop: Path, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [str(installed / "processor"), *args, "--json"],
        cwd=shop,
        env=user_env(PROCESSOR_DATA_DIR=str(shop / "data")),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode in (0, 3), done.stderr  # 3: not in the projection yet
    shown: dict[str, Any] = json.loads(done.stdout) if done.returncode == 0 else {}
    return shown


def test_run_imports_the_app_from_the_working_directory(
    installed: Path, shop: Path, started: list[Command]
) -> None:
    # The in-process workers run in a child process (the default isolation): it imports
    # shop too, so a run that succeeds shows that the child found it as well.
    run = Command(
        installed, shop, "run", "--app", "shop:app", "--workers", "1", "--no-http", "--json"
    )
    started.append(run)
    assert run.first_line()["ready"] is True
    submitted = _cli(installed, shop, "submit", "orders", "--input", '{"order_id": "o-1"}')

    def succeeded() -> dict[str, Any] | None:
        shown = _cli(installed, shop, "status", submitted["run_id"])
        return shown if shown.get("status") == "succeeded" else None

    shown = wait_until(succeeded, 60, "the run to succeed", max_pause_s=0.5)
    assert shown["result"] == {"order_id": "o-1", "confirmed": True}
    assert run.stop() == 0


def test_worker_imports_the_app_from_the_working_directory(
    installed: Path, shop: Path, started: list[Command]
) -> None:
    assert _cli(installed, shop, "topics", "apply")["created"]
    worker = Command(installed, shop, "worker", "--app", "shop:app", "--no-http", "--json")
    started.append(worker)
    assert worker.first_line() == {"ready": True, "workers": 1, "concurrency": 8}
    assert worker.stop() == 0


def test_the_docs_page_shows_with_what_the_wheel_installs(
    installed: Path, shop: Path, started: list[Command]
) -> None:
    args = ("run", "--app", "shop:app", "--workers", "0", "--json")
    run = Command(installed, shop, *args, PROCESSOR_HTTP_PORT="0")
    started.append(run)
    address = run.first_line()["http"]
    with httpx.Client(base_url=address, timeout=30) as http:
        assert_docs_offline(http.get)
    assert run.stop() == 0
