"""``processor history --after --limit``, ``requests``, ``dlq`` and ``rejected`` in pages,
from "another terminal" while ``processor run`` (embedded log) is running."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from processor.clients.topic_cursor import encode_cursor
from processor.config.settings import Settings
from processor.facts.topics import TopicName
from processor.transport.base import Outbound
from processor.transport.deployment import Deployment
from tests.apps.support import ProcessorProcess, cli, wait_until


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The data dir of a ``processor run`` that stays up for the whole module."""
    root = tmp_path_factory.mktemp("cli-pages")
    process = ProcessorProcess(
        root / "data", root / "processor.log", app="tests.apps.operator_pipelines:app"
    )
    try:
        process.start()
        process.wait_running()
        yield root / "data"
        process.check_alive()
        assert process.stop() == 0, process.log_text()
    finally:
        process.close()


def _json(result: Any) -> Any:
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip(), f"no output; stderr: {result.stderr}"
    return json.loads(result.stdout)


def _submit(data_dir: Path, pipeline: str, value: Any) -> str:
    run_id: str = _json(cli(data_dir, "submit", pipeline, "--input", json.dumps(value), "--json"))[
        "run_id"
    ]
    return run_id


def _ends(data_dir: Path, run_id: str, wanted: str) -> None:
    def ended() -> bool:
        result = cli(data_dir, "status", run_id, "--json")
        return result.returncode == 0 and json.loads(result.stdout)["status"] == wanted

    wait_until(ended, 60, f"run {run_id} to be {wanted}", max_pause_s=0.2)


def _pages(read: Callable[[str | None], dict[str, Any]], key: str, next_key: str) -> list[Any]:
    """Every page ``read`` gives, following ``next_key`` until it is null."""
    pages, position = [], None
    while True:
        page = read(position)
        pages.append(page[key])
        if page[next_key] is None:
            return pages
        position = page[next_key]
        assert len(pages) < 50, "paging never ended"


def test_history_pages_follow_next_after_to_the_whole_history(data_dir: Path) -> None:
    run_id = _submit(data_dir, "steps3", {"n": 21})
    _ends(data_dir, run_id, "succeeded")
    whole = _json(cli(data_dir, "history", run_id, "--json"))  # as before: a list

    def read(after: int | None) -> dict[str, Any]:
        start = [] if after is None else ["--after", str(after)]
        page: dict[str, Any] = _json(
            cli(data_dir, "history", run_id, *start, "--limit", "3", "--json")
        )
        assert page["run_id"] == run_id
        return page

    pages = _pages(read, "facts", "next_after")
    assert [f for page in pages for f in page] == whole
    assert len(pages) > 2 and all(len(page) == 3 for page in pages[:-1])

    text = cli(data_dir, "history", run_id, "--limit", "3")
    assert text.returncode == 0
    assert text.stdout.strip().splitlines()[-1] == "next page: --after 3"


@pytest.mark.parametrize("args", [("--limit", "0"), ("--limit", "1001"), ("--after", "-1")])
def test_history_page_options_out_of_range_exit_2(data_dir: Path, args: tuple[str, str]) -> None:
    result = cli(data_dir, "history", "any-run", *args)
    assert result.returncode == 2
    assert args[0] in result.stderr


def test_requests_lists_the_token_that_completes_the_run(data_dir: Path) -> None:
    run_id = _submit(data_dir, "scalar", {"n": 6})

    def listed() -> list[dict[str, Any]] | None:
        rows: list[dict[str, Any]] = _json(cli(data_dir, "requests", "--run", run_id, "--json"))
        return rows or None

    (request,) = wait_until(listed, 60, "the pending request", max_pause_s=0.2)
    assert (request["run_id"], request["target"], request["kind"]) == (run_id, "echo", "await")
    assert request["token"].startswith("v2.")
    by_target = _json(cli(data_dir, "requests", "--target", "echo", "--json"))
    assert run_id in {r["run_id"] for r in by_target}
    assert _json(cli(data_dir, "requests", "--target", "no-such-target", "--json")) == []
    text = cli(data_dir, "requests", "--run", run_id)
    assert f"token: {request['token']}" in text.stdout

    sent = cli(data_dir, "complete", request["token"], "--payload", '{"yes": true}')
    assert sent.returncode == 0, sent.stderr
    _ends(data_dir, run_id, "succeeded")
    assert _json(cli(data_dir, "requests", "--run", run_id, "--json")) == []


def _topic_pages(data_dir: Path, command: str) -> list[list[dict[str, Any]]]:
    def read(cursor: str | None) -> dict[str, Any]:
        start = [] if cursor is None else ["--cursor", cursor]
        page: dict[str, Any] = _json(cli(data_dir, command, *start, "--limit", "3", "--json"))
        return page

    return _pages(read, "records", "next_cursor")


def test_dlq_pages_give_each_dead_letter_once(data_dir: Path) -> None:
    failed = [_submit(data_dir, "non_retryable", {"n": n}) for n in range(4)]
    for run_id in failed:
        _ends(data_dir, run_id, "failed")
    pages = _topic_pages(data_dir, "dlq")
    letters = [r["run_id"] for page in pages for r in page]
    assert len(letters) == len(set(letters))  # once each
    assert set(failed) <= set(letters)
    assert all(len(page) == 3 for page in pages[:-1])
    assert _json(cli(data_dir, "dlq", "--json"))[: len(letters)] == [r for p in pages for r in p]


def test_rejected_pages_give_each_rejection_once(data_dir: Path) -> None:
    deployment = Deployment.from_settings(Settings(data_dir=data_dir))
    topic = deployment.topology.name(TopicName.COMPLETIONS)
    producer = deployment.transport.producer()
    try:
        for i in range(5):
            producer.produce(Outbound(topic, f"junk-{i}".encode(), b"not a completion"))
        producer.flush()
    finally:
        producer.close()

    def all_in() -> list[list[dict[str, Any]]] | None:
        pages = _topic_pages(data_dir, "rejected")
        junk = [r for page in pages for r in page if r["source_topic"] == topic]
        return pages if len(junk) >= 5 else None

    pages = wait_until(all_in, 60, "five rejections", max_pause_s=0.2)
    sources = [r["source"] for page in pages for r in page]
    assert len(sources) == len(set(sources))
    assert all(len(page) == 3 for page in pages[:-1])
    listed = _json(cli(data_dir, "rejected", "--json"))  # no paging option: a list, as before
    assert [r["source"] for r in listed] == sources


@pytest.mark.parametrize("command", ["dlq", "rejected"])
def test_a_bad_cursor_exits_2_with_a_reason(data_dir: Path, command: str) -> None:
    result = cli(data_dir, command, "--cursor", "garbage", "--json")
    assert result.returncode == 2
    assert result.stdout == ""
    assert "cursor" in json.loads(result.stderr)["error"]
    # A cursor of the other topic is refused too.
    other_topic = TopicName.DLQ if command == "rejected" else TopicName.REJECTED
    topology = Deployment.from_settings(Settings(data_dir=data_dir)).topology
    foreign = encode_cursor(topology.name(other_topic), {0: 0})
    other = cli(data_dir, command, "--cursor", foreign)
    assert other.returncode == 2
    assert "another topic" in other.stderr
