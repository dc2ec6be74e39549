"""Paged reads against a running loop, on each transport: history pages, pending
requests with the tokens the processor issued, and pages of admission.rejected and
runs.dlq written by the loop's own transactions."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from processor.clients.client import Client, fact_dict
from processor.clients.external import CompletionClient
from processor.clients.pages import history_page, pending_requests, read_topic_page
from processor.facts.keyring import KeyRing
from processor.facts.models import BoundaryCompletion, BoundaryRequest
from processor.facts.topics import TopicName
from processor.store.readers import open_reader
from processor.store.rocks import PartitionStore, store_path
from tests.apps.support import LoopHarness
from tests.boundaries.test_awaits import finish, play, run_until_suspended, status


@contextmanager
def _stores(h: LoopHarness) -> Iterator[list[PartitionStore]]:
    """The loop's stores, opened as readers beside it (as ``processor requests`` does)."""
    state_dir = h.deployment.settings.state_dir
    found = [open_reader(store_path(state_dir, p)) for p in range(h.deployment.topology.partitions)]
    stores = [s for s in found if s is not None]
    try:
        yield stores
    finally:
        for store in stores:
            store.close()


def _pending(h: LoopHarness, run_id: str | None = None, target: str | None = None) -> list[Any]:
    with _stores(h) as stores:
        return pending_requests(stores, h.keys, run_id, target)


def test_history_pages_cover_a_run_once_in_order(harness: LoopHarness) -> None:
    h = harness
    run_id, (request,) = run_until_suspended(h, "scalar", {"n": 3})
    h.produce_model(
        TopicName.COMPLETIONS,
        run_id,
        BoundaryCompletion(
            token=request.resume_token, idempotency_key="k", outcome="success", payload=b"4"
        ),
    )
    finish(h, run_id)
    client = Client(h.deployment.transport, h.deployment.topology, h.deployment.settings.state_dir)
    try:
        history = client.current(run_id).history
    finally:
        client.close()
    expected = [fact_dict(f) for f in h.facts(run_id)]
    assert len(expected) > 3 * 3  # several pages of three

    seen: list[dict[str, Any]] = []
    after = 0
    while True:
        page = history_page(history, after, 3)
        assert 1 <= len(page.facts) <= 3
        seen += page.facts
        if page.next_after is None:
            break
        after = page.next_after
    assert seen == expected
    assert [f["seq"] for f in seen] == list(range(1, len(expected) + 1))


def test_pending_requests_carry_the_issued_tokens_and_complete_the_run(
    harness: LoopHarness,
) -> None:
    h = harness
    scalar, (asked,) = run_until_suspended(h, "scalar", {"n": 5})
    fanned, squares = run_until_suspended(h, "itemized", {"items": 3})
    issued = {(r.run_id, r.item_index): r for r in [asked, *squares]}

    pending = _pending(h)
    assert {(p.run_id, p.item_index) for p in pending} == set(issued)
    for p in pending:
        request: BoundaryRequest = issued[(p.run_id, p.item_index)]
        assert p.token == request.resume_token  # exactly the token the processor issued
        assert (p.boundary, p.target, p.deadline_ms) == (
            request.boundary,
            request.target,
            request.deadline_ms,
        )
        assert p.kind == "await"
        assert set(p.as_dict()) == {
            "run_id",
            "boundary",
            "item_index",
            "kind",
            "target",
            "deadline_ms",
            "token",
            "partition",
        }
    assert [p.run_id for p in _pending(h, run_id=scalar)] == [scalar]
    assert [p.item_index for p in _pending(h, target="square")] == [0, 1, 2]
    assert _pending(h, target="nobody") == []

    # The listed token, sent as any external system sends it, continues the run.
    (listed,) = _pending(h, run_id=scalar)
    sender = CompletionClient(h.deployment.transport, h.deployment.topology)
    try:
        sender.complete(listed.token, {"answer": 42})
    finally:
        sender.close()
    play(h, lambda: status(h, scalar) == "succeeded", "the completed run to succeed")
    assert _pending(h, run_id=scalar) == []
    assert len(_pending(h, run_id=fanned)) == 3


def test_pending_requests_read_the_index_not_every_run(
    harness: LoopHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    waiting, _ = run_until_suspended(h, "scalar", {"n": 2})
    done, (request,) = run_until_suspended(h, "scalar", {"n": 3})
    h.produce_model(
        TopicName.COMPLETIONS,
        done,
        BoundaryCompletion(
            token=request.resume_token, idempotency_key="k", outcome="success", payload=b"1"
        ),
    )
    finish(h, done)
    asked: list[list[str]] = []
    real = PartitionStore.runs

    def runs(self: PartitionStore, run_ids: Any) -> Any:
        asked.append(list(run_ids))
        return real(self, run_ids)

    def no_scan(self: PartitionStore, family: str) -> Any:
        raise AssertionError(f"pending requests walked the {family} family")

    monkeypatch.setattr(PartitionStore, "runs", runs)
    monkeypatch.setattr(PartitionStore, "items", no_scan)
    assert [p.run_id for p in _pending(h)] == [waiting]
    # Only the waiting run's state was read: the finished one is not in the index's
    # waiting rows.
    assert [run_id for ids in asked for run_id in ids] == [waiting]


def test_a_token_of_a_removed_key_is_not_shown(harness: LoopHarness) -> None:
    h = harness
    run_id, _ = run_until_suspended(h, "scalar", {"n": 1})
    other = KeyRing.single(b"another-secret-0123456789abcdef", "other")
    with _stores(h) as stores:
        (shown,) = pending_requests(stores, other, run_id, None)
    assert shown.run_id == run_id and shown.token is None
    rotated = KeyRing((*other.keys, *h.keys.keys))  # the old key still verifies
    with _stores(h) as stores:
        (shown,) = pending_requests(stores, rotated, run_id, None)
    assert shown.token is not None and shown.token.split(".")[1] == h.keys.ids[0]


def _all_pages(h: LoopHarness, topic: TopicName, limit: int) -> list[list[dict[str, Any]]]:
    pages, cursor = [], None
    while True:
        page = read_topic_page(h.deployment.transport, h.name(topic), cursor, limit)
        pages.append(page.records)
        if page.next_cursor is None:
            return pages
        cursor = page.next_cursor
        assert len(pages) < 20, "paging never ended"


def test_rejected_input_pages_through_once_each(harness: LoopHarness) -> None:
    h = harness
    sources = [h.produce(TopicName.COMPLETIONS, f"junk-{i}", b"not avro %d" % i) for i in range(7)]
    h.drive(lambda: len(h.rejected.refresh()) >= 7, "seven rejections")
    pages = _all_pages(h, TopicName.REJECTED, 3)
    found = [r["source"] for page in pages for r in page]
    assert sorted(found) == sorted(f"{s.topic}/{s.partition}@{s.offset}" for s in sources)
    assert len(found) == len(set(found)) == 7
    assert all(len(page) == 3 for page in pages[:-1])


def test_dead_letters_page_through_once_each(harness: LoopHarness) -> None:
    h = harness
    failed = []
    for n in range(4):
        run_id, (request,) = run_until_suspended(h, "scalar", {"n": n})
        failure = BoundaryCompletion(
            token=request.resume_token, idempotency_key="f", outcome="failure", error=f"no {n}"
        )
        h.produce_model(TopicName.COMPLETIONS, run_id, failure)
        h.drive(lambda run_id=run_id: status(h, run_id) == "failed", "the run to fail")
        failed.append(run_id)
    pages = _all_pages(h, TopicName.DLQ, 3)
    letters = [r for page in pages for r in page]
    assert sorted(r["run_id"] for r in letters) == sorted(failed)
    assert [len(page) for page in pages][:1] == [3]
    assert all(r["pipeline"] == "scalar" and r["input"]["n"] in range(4) for r in letters)
