"""The run inspector page in a real (headless) Chromium, over a real ``processor run``.

Runs are submitted, completed and cancelled with the Python client while the page is
open; every assertion is about what the page shows, and every change must arrive by
the page's own live refresh (no reload), waited for with a deadline.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select, WebDriverWait

from processor.clients.client import Client
from processor.config.settings import Settings
from processor.facts.codec import encode
from processor.facts.models import AttemptProgress
from processor.facts.topics import TopicName
from processor.model.schedules import fire_run_id
from processor.model.state import RunState
from processor.transport.base import Outbound
from processor.transport.deployment import Deployment
from tests.apps.support import ProcessorProcess, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

T = TypeVar("T")
PAGE_WAIT_S = 30.0  # the page polls every 2 s; a processor on a busy CI machine is slower
RUN_WAIT_S = 60.0
#: What a table shows, read in one script call (rows are replaced on every refresh, so
#: element handles held across refreshes would go stale).
ROWS_JS = """
return Array.from(document.querySelectorAll(arguments[0])).map(
  (row) => Object.assign({text: row.innerText}, row.dataset));
"""
SHOT = "inspector.png"
APP = "tests.apps.control_pipelines:app"  # awaits, compensation, failures
CHILD_APP = "tests.apps.child_pipelines:app"  # child runs
NONE = "\N{EN DASH}"  # what the summary shows for a field without a value
TOKEN = "inspector-test-token-" + uuid.uuid4().hex[:8]
SERVING = re.compile(r"http: serving on (http://\S+)")


# --- helpers -------------------------------------------------------------------------------


def _until(driver: webdriver.Chrome, condition: Callable[[], T], what: str) -> T:
    """Wait for the page to show something, with a deadline."""
    waiting = WebDriverWait(
        driver, PAGE_WAIT_S, poll_frequency=0.2, ignored_exceptions=[StaleElementReferenceException]
    )
    return waiting.until(lambda _: condition(), message=f"the page to show {what}")


def _rows(driver: webdriver.Chrome, selector: str) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = driver.execute_script(ROWS_JS, selector)
    return rows


def _run_statuses(driver: webdriver.Chrome) -> dict[str, str]:
    return {row["runId"]: row["status"] for row in _rows(driver, "#runs-body tr")}


def _open(driver: webdriver.Chrome, inspected: Inspected) -> None:
    driver.get(inspected.base_url)
    _until(
        driver,
        lambda: driver.find_element(By.TAG_NAME, "body").get_attribute("data-refreshed"),
        "its first refresh",
    )


def _no_script_errors(driver: webdriver.Chrome) -> None:
    errors = [e for e in driver.get_log("browser") if e.get("source") == "javascript"]
    assert errors == [], errors


def _run_state(client: Client, run_id: str, check: Callable[[RunState], bool], what: str) -> None:
    def reached() -> bool:
        state = client.status(run_id)
        return state is not None and check(state)

    wait_until(reached, RUN_WAIT_S, f"run {run_id} {what}", max_pause_s=0.2)


def _report_started(data_dir: Path, client: Client, run_id: str) -> None:
    """What a worker sends when it starts the run's current step (then it vanishes)."""
    state = client.status(run_id)
    assert state is not None
    attempt = state.attempt
    report = AttemptProgress(
        run_id=run_id,
        segment=attempt.segment,
        attempt=attempt.number,
        generation=attempt.generation,
        step=attempt.next_step,
        report="started",
        worker_id="vanished-worker",
        at_ms=state.updated_ms,
    )
    deployment = Deployment.from_settings(Settings(data_dir=data_dir))
    producer = deployment.transport.producer()
    try:
        topic = deployment.topology.name(TopicName.RESULTS)
        producer.produce(Outbound(topic, run_id.encode(), encode(report)))
        producer.flush()
    finally:
        producer.close()


def _suspended(state: RunState) -> bool:
    return state.phase == "suspended"


def _submit(client: Client, pipeline: str, value: Any) -> str:
    receipt = client.submit(pipeline, value)
    assert receipt.created is True, receipt
    return receipt.run_id


def _enter_token(driver: webdriver.Chrome) -> None:
    driver.find_element(By.ID, "token-input").send_keys(TOKEN)
    driver.find_element(By.ID, "token-save").click()
    _until(
        driver,
        lambda: "saved" in driver.find_element(By.ID, "token-state").text,
        "that the token is kept",
    )


def _token_of(driver: webdriver.Chrome, run_id: str) -> str | None:
    """The resume token the pending interactions table shows for a run, if any."""
    cells = driver.find_elements(
        By.CSS_SELECTOR, f'#requests-body tr[data-run-id="{run_id}"] [data-testid="request-token"]'
    )
    return cells[0].text if cells else None


def _show_run(driver: webdriver.Chrome, run_id: str) -> None:
    """Open a run by the search box, as a user pasting a run id would."""
    search = driver.find_element(By.ID, "search-run-id")
    search.clear()
    search.send_keys(run_id)
    driver.find_element(By.ID, "search-go").click()
    _until(
        driver,
        lambda: (
            driver.find_element(By.CSS_SELECTOR, '[data-testid="summary-run-id"]').text == run_id
        ),
        f"the summary of run {run_id}",
    )


def _summary(driver: webdriver.Chrome, key: str) -> str:
    text: str = driver.find_element(By.CSS_SELECTOR, f'[data-testid="summary-{key}"]').text
    return text


# --- fixtures ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Inspected:
    """A ``processor run`` on the embedded log, and the address of its page."""

    process: ProcessorProcess
    data_dir: Path
    base_url: str


def _address(process: ProcessorProcess) -> str | None:
    process.check_alive()
    found = SERVING.search(process.log_text())
    return found.group(1) if found else None


@pytest.fixture(scope="module")
def inspected(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Inspected]:
    yield from _serve(tmp_path_factory.mktemp("inspector"), workers=2)


@pytest.fixture(scope="module")
def unattended(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Inspected]:
    """A processor without workers: an effectful attempt times out into Unknown."""
    yield from _serve(tmp_path_factory.mktemp("unattended"), workers=0)


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Inspected]:
    """A processor of pipelines that start child runs."""
    yield from _serve(tmp_path_factory.mktemp("family"), workers=2, app=CHILD_APP)


def _serve(root: Path, workers: int, app: str = APP) -> Iterator[Inspected]:
    process = ProcessorProcess(root / "data", root / "processor.log", app=app, workers=workers)
    process.extra_env = {"PROCESSOR_HTTP_TOKEN": TOKEN}  # HTTP on a free port: support.py
    process.start()
    try:
        url = wait_until(lambda: _address(process), 120, "the HTTP address", max_pause_s=0.2)
        yield Inspected(process, root / "data", url.rstrip("/") + "/")
        process.check_alive()
        assert process.stop() == 0, process.log_text()[-3000:]
    finally:
        process.close()


@pytest.fixture(scope="module")
def client(inspected: Inspected) -> Iterator[Client]:
    with Client(settings=Settings(data_dir=inspected.data_dir)) as c:
        yield c


@pytest.fixture(scope="module")
def runs(client: Client) -> dict[str, str]:
    """One run that succeeded, one that failed, one waiting at an await, by name."""
    ids = {
        "succeeded": _submit(client, "booking", {"id": "ok-1"}),
        "failed": _submit(client, "booking", {"id": "bad-1", "reject": True}),
        "waiting": _submit(client, "approval", {"n": 7}),
    }
    _run_state(client, ids["succeeded"], lambda s: s.status == "succeeded", "to succeed")
    _run_state(client, ids["failed"], lambda s: s.status == "failed", "to fail")
    _run_state(client, ids["waiting"], _suspended, "to wait at its await")
    return ids


# --- tests ---------------------------------------------------------------------------------


def test_the_runs_list_shows_each_run_with_its_status_and_filters_narrow_it(
    inspected: Inspected, runs: dict[str, str], browser: webdriver.Chrome
) -> None:
    _open(browser, inspected)
    expected = {run_id: status for status, run_id in runs.items()}
    expected[runs["waiting"]] = "running"
    _until(
        browser,
        lambda: {k: v for k, v in _run_statuses(browser).items() if k in expected} == expected,
        f"the three runs with their statuses {expected}",
    )
    # The processor alone owns every partition: the page says which it lists.
    page_line = browser.find_element(By.ID, "runs-page").text
    assert "of partitions 0, 1, 2, 3 (this processor's)" in page_line, page_line

    Select(browser.find_element(By.ID, "filter-status")).select_by_value("failed")
    browser.find_element(By.ID, "filter-apply").click()
    _until(
        browser,
        lambda: set(_run_statuses(browser)) == {runs["failed"]},
        "only the failed run",
    )

    browser.find_element(By.ID, "filter-reset").click()
    browser.find_element(By.ID, "filter-target").send_keys("approvals")
    browser.find_element(By.ID, "filter-apply").click()
    _until(
        browser,
        lambda: (
            runs["waiting"] in _run_statuses(browser)
            and runs["succeeded"] not in _run_statuses(browser)
        ),
        "the runs waiting on target approvals",
    )
    assert set(_run_statuses(browser).values()) == {"running"}

    # A time range that starts tomorrow (typed as a datetime-local value) holds no run.
    browser.find_element(By.ID, "filter-reset").click()
    tomorrow = (datetime.now() + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%S")
    browser.execute_script("document.getElementById('filter-since').value = arguments[0]", tomorrow)
    browser.find_element(By.ID, "filter-apply").click()
    _until(
        browser,
        lambda: (
            _run_statuses(browser) == {}
            and browser.find_element(By.ID, "runs-empty").is_displayed()
        ),
        "no run submitted from tomorrow on",
    )
    browser.find_element(By.ID, "filter-reset").click()
    _until(browser, lambda: expected.keys() <= _run_statuses(browser).keys(), "every run again")
    _no_script_errors(browser)


def test_a_run_timeline_lists_its_facts_in_order_with_both_outcomes(
    inspected: Inspected,
    client: Client,
    runs: dict[str, str],
    browser: webdriver.Chrome,
    tmp_path: Path,
) -> None:
    failed = runs["failed"]
    journal = [type(fact).__name__ for fact in client.history(failed)]
    _open(browser, inspected)
    _until(browser, lambda: failed in _run_statuses(browser), "the failed run in the list")
    link = browser.find_element(By.CSS_SELECTOR, f'#runs-body tr[data-run-id="{failed}"] a')
    link.click()  # by the link in the list this time
    _until(
        browser,
        lambda: [r["factType"] for r in _rows(browser, "#timeline-body tr")] == journal,
        f"the timeline {journal}",
    )
    seqs = [int(r["seq"]) for r in _rows(browser, "#timeline-body tr")]
    assert seqs == list(range(1, len(journal) + 1))
    assert {"RunSubmitted", "SegmentFailed", "CompensationStarted", "RunFailed"} <= set(journal)
    assert _summary(browser, "status") == "failed"
    state = client.status(failed)
    assert state is not None
    assert _summary(browser, "execution") == state.execution
    assert _summary(browser, "recovery") == state.recovery
    assert "the supplier rejected the booking" in _summary(browser, "error")
    browser.set_window_size(1400, 1500)  # the list and the run's summary and timeline
    browser.execute_script("window.scrollTo(0, 0)")
    browser.save_screenshot(str(tmp_path / SHOT))
    assert (tmp_path / SHOT).stat().st_size > 10_000
    _no_script_errors(browser)


def test_user_values_are_shown_as_text_never_as_markup(
    inspected: Inspected, client: Client, browser: webdriver.Chrome
) -> None:
    markup = "<img id=injected src=x>"  # no quotes: JSON shows them escaped
    run_id = _submit(client, "booking", {"id": markup})
    _run_state(client, run_id, lambda s: s.status == "succeeded", "to succeed")
    _open(browser, inspected)
    _show_run(browser, run_id)
    _until(browser, lambda: markup in _summary(browser, "result"), "the markup as text")
    assert browser.find_elements(By.ID, "injected") == []
    _no_script_errors(browser)


def test_searching_an_unknown_run_id_says_so(
    inspected: Inspected, browser: webdriver.Chrome
) -> None:
    _open(browser, inspected)
    missing = f"no-such-run-{uuid.uuid4()}"
    browser.find_element(By.ID, "search-run-id").send_keys(missing)
    browser.find_element(By.ID, "search-go").click()
    _until(
        browser,
        lambda: browser.find_element(By.ID, "detail-none").text == f"No run with id {missing}.",
        "that there is no such run",
    )
    assert not browser.find_element(By.ID, "detail-body").is_displayed()
    assert not browser.find_element(By.ID, "error-banner").is_displayed()


def test_a_pending_interaction_shows_its_token_and_a_completion_succeeds_the_run(
    inspected: Inspected, client: Client, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    run_id = _submit(client, "approval", {"n": 11})
    _run_state(client, run_id, _suspended, "to wait at its await")
    _open(browser, inspected)
    message = browser.find_element(By.ID, "requests-message").text
    assert "bearer token" in message
    assert _rows(browser, "#requests-body tr") == []

    _enter_token(browser)
    request = _until(
        browser,
        lambda: next(
            (r for r in _rows(browser, "#requests-body tr") if r["runId"] == run_id), None
        ),
        f"the pending interaction of run {run_id}",
    )
    assert request["target"] == "approvals"
    token = _token_of(browser, run_id)
    assert token is not None
    assert token.startswith("v2.")
    browser.save_screenshot(str(tmp_path / "pending.png"))

    client.complete(token, {"approved_by": "page test"})
    _until(
        browser,
        lambda: (
            run_id not in {r["runId"] for r in _rows(browser, "#requests-body tr")}
            and _run_statuses(browser).get(run_id) == "succeeded"
        ),
        f"run {run_id} succeeded and no longer pending",
    )
    state = client.status(run_id)
    assert state is not None
    assert state.status == "succeeded"
    _no_script_errors(browser)


def test_a_wrong_token_is_refused_on_the_page(
    inspected: Inspected, browser: webdriver.Chrome
) -> None:
    _open(browser, inspected)
    browser.find_element(By.ID, "token-input").send_keys(f"not-{uuid.uuid4()}")
    browser.find_element(By.ID, "token-save").click()
    _until(
        browser,
        lambda: "refused" in browser.find_element(By.ID, "requests-message").text,
        "that the token was refused",
    )
    assert _rows(browser, "#requests-body tr") == []


def test_a_cancelled_run_is_shown_cancelled_with_its_stop_reason(
    inspected: Inspected, client: Client, browser: webdriver.Chrome
) -> None:
    run_id = _submit(client, "approval", {"n": 12})
    _run_state(client, run_id, _suspended, "to wait at its await")
    _open(browser, inspected)
    _show_run(browser, run_id)
    assert _summary(browser, "status") == "running"

    reply = client.cancel(run_id, reason="customer changed their mind")
    assert reply is not None
    _until(
        browser,
        lambda: (
            _run_statuses(browser).get(run_id) == "cancelled"
            and _summary(browser, "status") == "cancelled"
        ),
        f"run {run_id} cancelled",
    )
    _until(
        browser,
        lambda: "customer changed their mind" in _summary(browser, "stop"),
        "the stop reason",
    )
    _until(browser, lambda: _summary(browser, "execution") == "Cancelled", "the execution outcome")
    _until(
        browser,
        lambda: "RunStopRequested" in {r["factType"] for r in _rows(browser, "#timeline-body tr")},
        "the stop intent in the timeline",
    )
    _no_script_errors(browser)


def test_dead_letters_list_the_failed_run(
    inspected: Inspected, runs: dict[str, str], browser: webdriver.Chrome
) -> None:
    _open(browser, inspected)
    row = _until(
        browser,
        lambda: next(
            (r for r in _rows(browser, "#dlq-body tr") if r["runId"] == runs["failed"]), None
        ),
        "the failed run among the dead letters",
    )
    assert "the supplier rejected the booking" in row["text"]
    assert runs["succeeded"] not in {r["runId"] for r in _rows(browser, "#dlq-body tr")}


def test_a_forged_completion_is_listed_among_the_rejected_inputs(
    inspected: Inspected, client: Client, runs: dict[str, str], browser: webdriver.Chrome
) -> None:
    waiting = runs["waiting"]
    _open(browser, inspected)
    _enter_token(browser)
    token = _until(browser, lambda: _token_of(browser, waiting), f"the token of run {waiting}")

    def forged_rows() -> int:
        return sum(r["reason"] == "invalid_token" for r in _rows(browser, "#rejected-body tr"))

    before = forged_rows()
    mac_at = token.rindex(".") + 1  # a token of the right shape whose signature is wrong
    forged = token[:mac_at] + ("A" if token[mac_at] != "A" else "B") + token[mac_at + 1 :]
    client.complete(forged, {"approved": "by a forger"})
    _until(
        browser,
        lambda: forged_rows() == before + 1,
        "the forged completion among the rejected inputs, as invalid_token",
    )
    assert _token_of(browser, waiting) == token  # the run still waits for the real one
    _no_script_errors(browser)


def test_an_unknown_attempt_is_shown_waiting_for_an_operator_until_resolved(
    unattended: Inspected, browser: webdriver.Chrome
) -> None:
    with Client(settings=Settings(data_dir=unattended.data_dir)) as client:
        run_id = _submit(client, "payment", {"id": "pay-1", "amount": 5})
        # A worker reports it started the effectful step and is never heard of again: at
        # the step's timeout (from that start) its outcome is Unknown.
        _run_state(client, run_id, lambda s: s.phase == "dispatched", "to be dispatched")
        _report_started(unattended.data_dir, client, run_id)
        _run_state(client, run_id, lambda s: s.unknown is not None, "to have an Unknown attempt")
        state = client.status(run_id)
        assert state is not None
        assert state.unknown is not None
        unknown = state.unknown
        _open(browser, unattended)
        _show_run(browser, run_id)
        banner = _until(
            browser,
            lambda: (b := browser.find_element(By.ID, "unknown-attempt")).is_displayed() and b,
            "the Unknown attempt",
        )
        assert "Waiting for an operator" in banner.text
        assert (
            f"--segment {unknown.segment} --attempt {unknown.attempt} "
            f"--generation {unknown.generation}" in banner.text
        )
        reply = client.resolve(
            run_id,
            segment=unknown.segment,
            attempt=unknown.attempt,
            generation=unknown.generation,
            idempotency_key="page-test",
            action="succeed",
            output={"id": "pay-1", "authorized": 5},
        )
        assert reply is not None
        assert reply.refusal is None, reply
    _until(
        browser,
        lambda: not browser.find_element(By.ID, "unknown-attempt").is_displayed(),
        "the Unknown attempt resolved",
    )
    # The summary is redrawn before the new facts arrive: wait for them too.
    facts = _until(
        browser,
        lambda: (
            "AttemptResolved" in (t := [r["factType"] for r in _rows(browser, "#timeline-body tr")])
            and t
        ),
        "the resolution in the timeline",
    )
    assert facts.index("AttemptOutcomeUnknown") < facts.index("AttemptResolved")
    _no_script_errors(browser)


def test_a_parent_and_its_children_link_to_each_other(
    family: Inspected, browser: webdriver.Chrome
) -> None:
    with Client(settings=Settings(data_dir=family.data_dir)) as client:
        parent = _submit(client, "many", [1, 2])
        _run_state(client, parent, lambda s: s.status == "succeeded", "to succeed")
    _open(browser, family)
    _show_run(browser, parent)
    assert _summary(browser, "parent") == NONE
    links = _until(
        browser,
        lambda: browser.find_elements(By.CSS_SELECTOR, '[data-testid="child"] a'),
        "the child runs",
    )
    children = [link.text for link in links]
    assert len(children) == 2 and parent not in children
    assert all(": admitted" in item.text for item in _children(browser))

    links[1].click()  # to the second child, and back to its parent by its link
    _until(browser, lambda: _summary(browser, "run-id") == children[1], "the child run")
    assert _summary(browser, "pipeline").startswith("kid")
    assert _summary(browser, "parent") == f"{parent} (depth 1)"
    assert _summary(browser, "children") == NONE
    browser.find_element(By.CSS_SELECTOR, '[data-testid="summary-parent"] a').click()
    _until(browser, lambda: _summary(browser, "run-id") == parent, "the parent run again")
    _no_script_errors(browser)


def test_a_scheduled_run_names_its_schedule_and_fire_time(
    family: Inspected, browser: webdriver.Chrome
) -> None:
    schedule_id = f"page-{uuid.uuid4().hex[:8]}"
    with Client(settings=Settings(data_dir=family.data_dir)) as client:
        start = int(time.time() * 1000)
        client.schedules.create(schedule_id, "kid", {"n": 3}, interval_s=1, start_ms=start)
        run_id = fire_run_id(schedule_id, start + 1_000)
        try:
            _run_state(client, run_id, lambda s: s.status == "succeeded", "to succeed")
        finally:
            client.schedules.delete(schedule_id)
    _open(browser, family)
    _show_run(browser, run_id)
    shown = _summary(browser, "schedule")
    assert shown.startswith(f"{schedule_id}, fire time "), shown
    assert _summary(browser, "parent") == NONE
    _no_script_errors(browser)


def _children(driver: webdriver.Chrome) -> list[WebElement]:
    found: list[WebElement] = driver.find_elements(By.CSS_SELECTOR, '[data-testid="child"]')
    return found
