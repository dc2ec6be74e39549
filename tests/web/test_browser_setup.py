"""The browser tests skip on a laptop without Chromium, but never in CI."""

from __future__ import annotations

import pytest

from tests.web import browser


@pytest.fixture
def no_chromium(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(browser.shutil, "which", lambda name: None)
    monkeypatch.setattr(browser, "DEBIAN_DRIVER", browser.Path("/nonexistent/chromedriver"))


@pytest.mark.usefixtures("no_chromium")
def test_without_chromium_ci_fails_with_the_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="apt-get install -y chromium chromium-driver"):
        browser.require_chromium()


@pytest.mark.usefixtures("no_chromium")
def test_without_chromium_a_developer_machine_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception):
        browser.require_chromium()


def test_the_installed_chromium_is_found_with_its_driver() -> None:
    found = browser.require_chromium()  # fails under CI=true if .ci/run did not install it
    assert found.binary.endswith(("chromium", "chromium-browser"))
    assert found.driver.endswith("chromedriver")
