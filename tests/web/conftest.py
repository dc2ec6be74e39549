"""Fixtures of the HTTP tests: a real ``processor run`` on each transport."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from selenium import webdriver

from tests.web.browser import Chromium, headless_chromium, require_chromium
from tests.web.support import Served, serve

TRANSPORTS = ["embedded", pytest.param("kafka", marks=pytest.mark.kafka)]


@pytest.fixture(scope="module", params=TRANSPORTS)
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """One processor per module and transport, shared by the module's tests."""
    running = serve(request.param, tmp_path_factory.mktemp(f"web-{request.param}"))
    try:
        yield running
    finally:
        running.close()


@pytest.fixture(params=TRANSPORTS)
def fresh(request: pytest.FixtureRequest, tmp_path: object) -> Iterator[Served]:
    """A processor of the test's own (its metrics start at zero)."""
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    running = serve(request.param, tmp_path)
    try:
        yield running
    finally:
        running.close()


# --- the browser (tests/web/test_inspector_page.py) ----------------------------------------


@pytest.fixture(scope="session")
def chromium() -> Chromium:
    """Debian's Chromium and chromedriver (skipped without them, failed under CI=true)."""
    return require_chromium()


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
