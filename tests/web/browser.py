"""Headless Chromium from Debian's packages, driven by Selenium, with nothing downloaded.

Selenium Manager is never consulted: the driver's path is given to the Service, the
browser's to the options, and ``SE_OFFLINE`` forbids any download should a later
Selenium version look anyway. Outside CI, a machine without Chromium skips the browser
tests; under ``CI=true`` they fail, so CI can never pass without running them.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

__all__ = ["Chromium", "find_chromium", "headless_chromium"]

BROWSERS = ("chromium", "chromium-browser")
DRIVER = "chromedriver"
DEBIAN_DRIVER = Path("/usr/bin/chromedriver")
#: Headless, and no calls home: updates, sync and background fetches are all off.
FLAGS = (
    "--headless=new",
    "--no-sandbox",  # CI runs as root, where the sandbox cannot start
    "--disable-gpu",
    "--disable-dev-shm-usage",  # small /dev/shm in containers
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
)


@dataclass(frozen=True, slots=True)
class Chromium:
    """Where the browser and its driver are."""

    binary: str
    driver: str


def find_chromium() -> Chromium | None:
    """The installed Chromium and chromedriver, or None if either is missing."""
    binary = next(filter(None, map(shutil.which, BROWSERS)), None)
    driver = shutil.which(DRIVER) or (str(DEBIAN_DRIVER) if DEBIAN_DRIVER.is_file() else None)
    if binary is None or driver is None:
        return None
    return Chromium(binary, driver)


def require_chromium() -> Chromium:
    """The installed Chromium; skip without it, but fail under CI (it must run there)."""
    found = find_chromium()
    if found is not None:
        return found
    reason = (
        "Chromium and chromedriver are not installed "
        "(apt-get install -y chromium chromium-driver; .ci/run does it)"
    )
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(f"CI=true: the browser tests must run, but {reason}")
    pytest.skip(reason)


def headless_chromium(found: Chromium, profile: Path) -> webdriver.Chrome:
    """A headless Chromium with a fresh profile directory, and Selenium Manager kept out."""
    os.environ["SE_OFFLINE"] = "true"  # a Selenium Manager run, if any, may not download
    options = Options()
    options.binary_location = found.binary
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=found.driver)
    return webdriver.Chrome(options=options, service=service)
