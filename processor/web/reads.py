"""The read routes of the JSON API: runs (from the runs index), a run, its history,
pending requests, what became of a completion, rejected input and dead letters, a
page at a time.

One rule for resume tokens: an answer shows them whole only to a request with the
bearer token (``/api/requests``, made of them, refuses any other); every other
answer shows them redacted (``clients/redaction.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from processor.clients.client import status_dict
from processor.clients.pages import (
    MAX_PAGE,
    CursorError,
    history_page,
    pending_requests,
    read_topic_page,
    record_dict,
)
from processor.clients.redaction import redacted, redacted_record_dict
from processor.facts.topics import TopicName
from processor.store.listing import MAX_LIMIT, RunQuery, list_runs
from processor.store.readers import store_partitions
from processor.web.auth import authorized
from processor.web.context import WebContext
from processor.web.errors import ApiError
from processor.web.models import (
    CompletionDecision,
    ErrorBody,
    History,
    Requests,
    RunList,
    RunStatus,
    TopicRecords,
)

__all__ = ["DEFAULT_LIMIT", "read_routes", "request_routes", "shown_to"]

#: Items of a page when the request gives no ``limit``.
DEFAULT_LIMIT = 50
# A completion with no decision found (the key is not echoed: it may be a token).
_UNDECIDED = (
    "no completion of run {run_id} with this idempotency key was admitted or refused: "
    "it may not be decided yet (no processor has read it), or was never written for this run"
)


def read_routes(router: APIRouter, context: WebContext, reader: Any) -> None:
    @router.get(
        "/runs",
        summary="List runs, newest submitted first, by status, pipeline, time and target",
        response_model=RunList,
        responses={400: {"model": ErrorBody}},
        dependencies=[reader],
    )
    def runs(
        request: Request,
        *,
        status: Annotated[str | None, Query(description="running, succeeded, ...")] = None,
        pipeline: str | None = None,
        since: Annotated[int | None, Query(ge=0, description="Submitted at or after (ms)")] = None,
        until: Annotated[int | None, Query(ge=0, description="Submitted before (epoch ms)")] = None,
        target: Annotated[str | None, Query(description="Waiting at a boundary on it")] = None,
        cursor: Annotated[str | None, Query(description="next_cursor of a page")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
    ) -> RunList:
        query = RunQuery(status, pipeline, since, until, target)
        assert context.stores is not None
        try:
            with context.stores.fresh(context.owned()) as stores:
                page = list_runs(stores, query, cursor, limit)
                partitions = store_partitions(stores)
        except ValueError as exc:
            raise _bad_query(str(exc)) from exc
        shown = shown_to(context, request)([run.as_dict() for run in page.runs])
        return RunList(runs=shown, next_cursor=page.next_cursor, partitions=partitions)

    @router.get(
        "/runs/{run_id}",
        summary="One run's status (as of the end of runs.facts)",
        response_model=RunStatus,
        responses={404: {"model": ErrorBody}},
        dependencies=[reader],
    )
    def run_status(request: Request, run_id: str) -> dict[str, Any]:
        with context.client() as client:
            state = client.current(run_id).state
        if state is None:
            raise ApiError(404, "unknown_run", f"no run {run_id}")
        shown: dict[str, Any] = shown_to(context, request)(status_dict(state))
        return shown

    @router.get(
        "/runs/{run_id}/history",
        summary="A run's facts in order, a page at a time (after a fact seq)",
        response_model=History,
        responses={404: {"model": ErrorBody}},
        dependencies=[reader],
    )
    def run_history(
        request: Request,
        run_id: str,
        after: Annotated[int, Query(ge=0, description="Facts after this seq")] = 0,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_LIMIT,
    ) -> History:
        with context.client() as client:
            facts = client.current(run_id).history
        if not facts:
            raise ApiError(404, "unknown_run", f"no run {run_id}")
        page = history_page(facts, after, limit)
        facts = shown_to(context, request)(page.facts)
        return History(run_id=run_id, facts=facts, next_after=page.next_after)

    @router.get(
        "/completions/{run_id}/{idempotency_key:path}",
        summary="What admission decided on a completion, by its run and idempotency key",
        response_model=CompletionDecision,
        responses={404: {"model": ErrorBody}},
        dependencies=[reader],
    )
    def completion(request: Request, run_id: str, idempotency_key: str) -> dict[str, Any]:
        with context.client() as client:
            found = client.completion(run_id, idempotency_key)
        if found is None:
            raise ApiError(404, "unknown_completion", _UNDECIDED.format(run_id=run_id))
        shown: dict[str, Any] = shown_to(context, request)(found.as_dict())
        return shown

    @router.get(
        "/rejected",
        summary="Refused input kept in admission.rejected, a page at a time",
        response_model=TopicRecords,
        responses={400: {"model": ErrorBody}},
        dependencies=[reader],
    )
    def rejected(
        request: Request,
        cursor: Annotated[str | None, Query(description="next_cursor of a page")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_LIMIT,
    ) -> TopicRecords:
        return _topic_page(context, request, TopicName.REJECTED, cursor, limit)

    @router.get(
        "/dlq",
        summary="Dead letters of runs.dlq (runs that failed for good), a page at a time",
        response_model=TopicRecords,
        responses={400: {"model": ErrorBody}},
        dependencies=[reader],
    )
    def dlq(
        request: Request,
        cursor: Annotated[str | None, Query(description="next_cursor of a page")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_LIMIT,
    ) -> TopicRecords:
        return _topic_page(context, request, TopicName.DLQ, cursor, limit)


def shown_to(context: WebContext, request: Request) -> Callable[[Any], Any]:
    """What an answer goes through: as it is with the bearer token, else redacted."""
    return _as_it_is if authorized(context, request) else redacted


def _as_it_is(value: Any) -> Any:
    return value


def _topic_page(
    context: WebContext, request: Request, topic: TopicName, cursor: str | None, limit: int
) -> TopicRecords:
    deployment = context.deployment
    assert deployment is not None
    name, partitions = deployment.topology.name(topic), deployment.topology.partitions
    # Redacted in the records' bytes: their original bytes are shown in hex.
    shape = record_dict if authorized(context, request) else redacted_record_dict
    try:
        page = read_topic_page(
            deployment.transport, name, cursor, limit, partitions=partitions, shape=shape
        )
    except CursorError as exc:
        raise ApiError(400, "bad_cursor", str(exc)) from exc
    return TopicRecords(records=page.records, next_cursor=page.next_cursor)


def request_routes(router: APIRouter, context: WebContext, writer: Any) -> None:
    @router.get(
        "/requests",
        summary="Pending requests (open interactions) with their resume tokens",
        response_model=Requests,
        dependencies=[writer],  # it reveals tokens: the bearer token always
    )
    def requests(
        run: Annotated[str | None, Query(description="Only this run's")] = None,
        target: Annotated[str | None, Query(description="Only requests to this target")] = None,
    ) -> Requests:
        assert context.stores is not None and context.keys is not None
        with context.stores.fresh(context.owned()) as stores:
            found = pending_requests(stores, context.keys, run, target)
            partitions = store_partitions(stores)
        return Requests(requests=[request.as_dict() for request in found], partitions=partitions)


def _bad_query(message: str) -> ApiError:
    """A refused query: a bad cursor, or a filter the listing does not know."""
    return ApiError(400, "bad_cursor" if "cursor" in message else "bad_query", message)
