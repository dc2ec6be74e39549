"""The run inspector's graph in a real (headless) Chromium, over a real ``processor run``.

A run of ``fulfil`` (tests/apps/web_pipelines.py) has parallel branches (charge and
reserve), a caught failure (reserve, handled by backorder), a switch whose other route
is skipped (ship) and a fan-out (price, over three lines, one failing). The page draws
it; moving the slider back shows it as it was after an earlier fact, folded from the
run's history by ``/api/runs/{id}/graph?at_seq=``.

Screenshots go to the test's directory, and to ``$SCREENSHOTS_DIR`` when it is set
(the README's are made with ``SCREENSHOTS_DIR=docs``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.apps.support import wait_until
from tests.web.support import Served, serve, status_of, submit

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

T = TypeVar("T")
PAGE_WAIT_S = 30.0
#: Every node of the drawing and every edge, read in one script call (the drawing is
#: replaced on every refresh, so element handles would go stale).
GRAPH_JS = """
const svg = document.getElementById('graph-svg');
const read = (sel) => Array.from(svg.querySelectorAll(sel)).map((e) => ({...e.dataset}));
return {seq: svg.dataset.seq, nodes: read('[data-testid=graph-node]'),
        edges: read('[data-testid=graph-edge]')};
"""
SLIDE_JS = """
const slider = document.getElementById('graph-seq');
slider.value = arguments[0];
slider.dispatchEvent(new Event('input', {bubbles: true}));
"""
FINAL = {
    "begin": "succeeded",
    "charge": "succeeded",
    "reserve": "caught",
    "backorder": "succeeded",
    "choose": "succeeded",
    "ship": "skipped",
    "pickup": "succeeded",
    "lines": "succeeded",
    "price": "succeeded",
    "confirm": "succeeded",
    "release": "succeeded",
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    running = serve("embedded", tmp_path_factory.mktemp("graph-page"))
    try:
        yield running
    finally:
        running.close()


@pytest.fixture(scope="module")
def run(served: Served) -> dict[str, Any]:
    """A finished run of fulfil: reserve fails and is caught, the pickup route is taken."""
    http = served.http(token=None)
    run_id = submit(served.http(), "fulfil", {"out_of_stock": True, "pickup": True})["run_id"]
    wait_until(lambda: status_of(http, run_id)["status"] == "succeeded", 60, "the run succeeded")
    facts = http.get(f"/api/runs/{run_id}/history", params={"limit": 1000}).json()["facts"]
    return {"id": run_id, "facts": facts}


def _until(driver: webdriver.Chrome, condition: Callable[[], T], what: str) -> T:
    waiting = WebDriverWait(
        driver, PAGE_WAIT_S, poll_frequency=0.2, ignored_exceptions=[StaleElementReferenceException]
    )
    return waiting.until(lambda _: condition(), message=f"the page to show {what}")


def _drawn(driver: webdriver.Chrome) -> dict[str, Any]:
    drawn: dict[str, Any] = driver.execute_script(GRAPH_JS)
    return drawn


def _states(driver: webdriver.Chrome) -> dict[str, str]:
    return {node["name"]: node["state"] for node in _drawn(driver)["nodes"]}


def _labels(driver: webdriver.Chrome) -> dict[str, str]:
    return {node["name"]: node["label"] for node in _drawn(driver)["nodes"]}


def _taken(driver: webdriver.Chrome) -> dict[tuple[str, str], str]:
    return {(e["from"], e["to"]): e["taken"] for e in _drawn(driver)["edges"]}


def _shown_at(driver: webdriver.Chrome, seq: int) -> dict[str, str]:
    """Wait until the drawing is the one after fact ``seq``; its node states."""
    _until(driver, lambda: _drawn(driver)["seq"] == str(seq), f"the graph after fact {seq}")
    return _states(driver)


def _seq_of(facts: list[dict[str, Any]], kind: str, step: int | None = None) -> int:
    return int(
        next(f["seq"] for f in facts if f["type"] == kind and (step is None or f["step"] == step))
    )


def _shoot(driver: webdriver.Chrome, tmp_path: Path, name: str) -> None:
    """The graph panel's screenshot, in the test's directory (and $SCREENSHOTS_DIR)."""
    panel = driver.find_element(By.ID, "graph-panel")
    driver.execute_script("arguments[0].scrollIntoView({block: 'start'})", panel)
    shot = tmp_path / name
    assert panel.screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    target = os.environ.get("SCREENSHOTS_DIR")
    if target:
        shutil.copyfile(shot, Path(target) / name)


def _no_script_errors(driver: webdriver.Chrome) -> None:
    errors = [e for e in driver.get_log("browser") if e.get("source") == "javascript"]
    assert errors == [], errors


def test_the_graph_of_a_run_and_its_history_fact_by_fact(
    served: Served, run: dict[str, Any], browser: webdriver.Chrome, tmp_path: Path
) -> None:
    run_id, facts = run["id"], run["facts"]
    last = int(facts[-1]["seq"])
    browser.set_window_size(1400, 1000)
    browser.get(f"{served.url}/#run={run_id}")
    _until(browser, lambda: _states(browser) == FINAL, f"the final states {FINAL}")
    assert _drawn(browser)["seq"] == str(last)
    labels = _labels(browser)
    assert labels["ship"] == "skipped: predicate_false"
    assert labels["reserve"] == "caught → backorder"
    assert labels["choose"] == "succeeded → pickup"
    taken = _taken(browser)
    assert taken["choose", "pickup"] == "taken"
    assert taken["choose", "ship"] == "not-taken"
    assert taken["reserve", "backorder"] == "taken"
    assert taken["begin", "charge"] == "open"
    progress = {n["name"]: n.get("progress") for n in _drawn(browser)["nodes"]}
    assert progress["price"] == "2/3 done, 1 failed"
    assert progress["charge"] is None
    assert "(live)" in browser.find_element(By.ID, "graph-at").text
    # The caught error is in the node's tooltip.
    title = browser.find_element(By.CSS_SELECTOR, '[data-name="reserve"] title')
    assert "no stock left" in title.get_attribute("textContent")
    _shoot(browser, tmp_path, "inspector-graph.png")

    # Back to when both branches were in flight: charge and reserve running side by side.
    both = max(_seq_of(facts, "NodeReady", 1), _seq_of(facts, "NodeReady", 2))
    browser.execute_script(SLIDE_JS, both)
    states = _shown_at(browser, both)
    assert (states["charge"], states["reserve"]) == ("running", "running")
    assert {states[name] for name in ("backorder", "choose", "ship", "pickup")} == {"pending"}
    assert "(live)" not in browser.find_element(By.ID, "graph-at").text
    _shoot(browser, tmp_path, "inspector-graph-parallel.png")

    # The fan-out with two items in flight (its limit).
    second = next(int(f["seq"]) for f in facts if f["type"] == "NodeReady" and f.get("item") == 1)
    browser.execute_script(SLIDE_JS, second)
    assert _shown_at(browser, second)["price"] == "running"
    price = next(n for n in _drawn(browser)["nodes"] if n["name"] == "price")
    assert price["progress"] == "0/3 done, 2 in flight"
    _shoot(browser, tmp_path, "inspector-graph-fan-out.png")

    # Reserve failed, its catch not yet decided.
    caught = _seq_of(facts, "CatchDecided")
    browser.execute_script(SLIDE_JS, caught - 1)
    states = _shown_at(browser, caught - 1)
    assert states["reserve"] == "failed"
    assert _labels(browser)["reserve"] == "failed: no stock left"
    assert states["backorder"] == "pending"
    browser.find_element(By.ID, "graph-next").click()  # one fact on: the catch
    assert _shown_at(browser, caught)["reserve"] == "caught"
    assert _taken(browser)["reserve", "backorder"] == "taken"

    # A fact of the timeline shows the graph after it: the route decided, ship skipped.
    skipped = _seq_of(facts, "NodeSkipped")
    browser.find_element(By.CSS_SELECTOR, f'#timeline-body tr[data-seq="{skipped}"] td').click()
    states = _shown_at(browser, skipped)
    assert (states["ship"], states["pickup"]) == ("skipped", "pending")
    assert _taken(browser)["choose", "pickup"] == "taken"
    current = browser.find_elements(By.CSS_SELECTOR, "#timeline-body tr.fact-current")
    assert [row.get_attribute("data-seq") for row in current] == [str(skipped)]

    # The first fact: nothing ran yet. Then back to the latest, live again.
    browser.execute_script(SLIDE_JS, 1)
    assert set(_shown_at(browser, 1).values()) == {"pending"}
    browser.find_element(By.ID, "graph-latest").click()
    assert _shown_at(browser, last) == FINAL
    _until(browser, lambda: "(live)" in browser.find_element(By.ID, "graph-at").text, "live")
    _no_script_errors(browser)


def test_a_live_run_moves_on_the_graph_while_the_slider_is_at_the_latest(
    served: Served, browser: webdriver.Chrome
) -> None:
    """A chain waiting at its await is drawn as a line; its completion moves it on."""
    http = served.http()
    run_id = submit(http, "orders", {"order_id": "page-1", "amount": 2})["run_id"]
    wait_until(lambda: status_of(http, run_id)["phase"] == "suspended", 60, "the await")
    browser.get(f"{served.url}/#run={run_id}")
    waiting = {
        "validate": "succeeded",
        "reserve_stock": "succeeded",
        "capture_payment": "waiting",
        "invoice": "pending",
    }
    _until(browser, lambda: _states(browser) == waiting, f"the chain waiting {waiting}")
    requests = http.get("/api/requests", params={"run": run_id}).json()["requests"]
    assert len(requests) == 1
    answer = http.post(
        "/api/completions",
        json={
            "token": requests[0]["token"],
            "outcome": "succeeded",
            "output": {"order_id": "page-1", "amount": 2.4, "payment_id": "pay-1"},
        },
    )
    assert answer.status_code in (200, 202), answer.text
    done = dict.fromkeys(waiting, "succeeded")
    _until(browser, lambda: _states(browser) == done, "the chain succeeded, by the live refresh")
    _no_script_errors(browser)


def test_an_unknown_run_has_no_graph(served: Served, browser: webdriver.Chrome) -> None:
    browser.get(f"{served.url}/#run=no-such-run")
    _until(
        browser,
        lambda: browser.find_element(By.ID, "detail-none").text == "No run with id no-such-run.",
        "that there is no such run",
    )
    assert not browser.find_element(By.ID, "graph-panel").is_displayed()
