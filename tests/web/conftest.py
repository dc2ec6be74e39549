"""A real ``processor run`` with its HTTP server, and a headless Chromium to look at it."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest
from selenium import webdriver

from processor.clients.client import Client
from processor.config.settings import Settings
from tests.apps.support import REPO_ROOT, subprocess_env, wait_until
from tests.web.browser import Chromium, headless_chromium, require_chromium

APP = "tests.apps.control_pipelines:app"
TOKEN = "inspector-test-token-0123456789"
SERVING = re.compile(r"http: serving on (http://\S+)")


@dataclass
class ServedProcessor:
    """``processor run`` on the embedded log, its HTTP server on a free port."""

    data_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    base_url: str = ""
    _log: IO[bytes] | None = None

    def start(self) -> None:
        env = subprocess_env(self.data_dir)
        env["PROCESSOR_HTTP_PORT"] = "0"  # any free port: read back from the log
        env["PROCESSOR_HTTP_TOKEN"] = TOKEN
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "processor", "run", "--app", APP, "--workers", "2"],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        url = wait_until(self._served_url, 60, "the processor to print its HTTP address", 0.2)
        self.base_url = url.rstrip("/") + "/"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _served_url(self) -> str | None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"processor exited:\n{self.log_text()[-3000:]}")
        found = SERVING.search(self.log_text())
        return found.group(1) if found else None

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.terminate()
        try:
            return self.proc.wait(60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(30)
            if self._log is not None:
                self._log.close()


@pytest.fixture(scope="session")
def chromium() -> Chromium:
    return require_chromium()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedProcessor]:
    root = tmp_path_factory.mktemp("inspector")
    processor = ServedProcessor(root / "data", root / "processor.log")
    processor.start()
    try:
        yield processor
    finally:
        code = processor.stop()
    assert code == 0, processor.log_text()[-3000:]


@pytest.fixture(scope="module")
def client(served: ServedProcessor) -> Iterator[Client]:
    with Client(settings=Settings(data_dir=served.data_dir)) as c:
        yield c


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item,
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep each phase's report on the test item, for the browser fixture's teardown."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture
def browser(
    chromium: Chromium, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[webdriver.Chrome]:
    """A fresh headless Chromium (its own profile: no token left over from another test)."""
    driver = headless_chromium(chromium, tmp_path / "chromium-profile")
    try:
        yield driver
        report = getattr(request.node, "report_call", None)
        if report is not None and report.failed:
            # What the page showed when the test gave up, for whoever reads the CI log.
            driver.save_screenshot(str(tmp_path / "failure.png"))
            print(f"screenshot: {tmp_path / 'failure.png'}")
            print(driver.find_element("tag name", "body").text[:4000])
    finally:
        driver.quit()
