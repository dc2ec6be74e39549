"""The compiled fold (processor_native) writes exactly the rows the Python reducers write.

Every scenario catches the same log up into two fresh stores, once with the Python
reducers (the reference) and once with the compiled fold, and compares every row of
every column family; it also checks the compiled fold really folded (a fold that
declined every batch would pass the comparison by falling back to Python).
"""

from __future__ import annotations

import io
import itertools
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processor.facts import codec as codec_module
from processor.facts.codec import SCHEMA_DIR, decode_fact, encode
from processor.facts.models import (
    FACT_TYPES,
    AttemptHeartbeatRecorded,
    AttemptLost,
    AttemptOutcomeUnknown,
    AttemptResolved,
    AttemptStepStarted,
    BoundaryCompletionAdmitted,
    BoundaryDispatchCompleted,
    BoundaryInteractionDispatched,
    BoundaryInteractionQueued,
    CatchDecided,
    ChildRunLinked,
    CompensationAttemptFailed,
    CompensationAttemptStarted,
    CompensationStarted,
    CompensationStepCompleted,
    CompensationStepSkipped,
    ContinuationSegmentCreated,
    EventEmitted,
    FactHeader,
    FanOutItemSettled,
    GraphSettled,
    InteractionTimedOut,
    NodeReady,
    NodeSettled,
    NodeSkipped,
    RetryScheduled,
    RouteDecided,
    RunDefinitionBlocked,
    RunFailed,
    RunQuarantined,
    RunRedriven,
    RunReleased,
    RunStopped,
    RunStopRequested,
    RunSubmitted,
    RunSucceeded,
    ScheduledRunLinked,
    SegmentAttemptStarted,
    SegmentCompleted,
    SegmentFailed,
    SegmentSuspended,
    SleepCompleted,
    SleepStarted,
    StepCompleted,
    TerminalPublicationCompleted,
    TerminalPublicationPrepared,
)
from processor.model import event_waits
from processor.model import reduce as reduce_module
from processor.model.due import due_entries
from processor.model.reduce import fold
from processor.model.state import RunChanges, RunState
from processor.restore.catch_up import catch_up
from processor.store import keys, native_fold
from processor.store.rocks import COLUMN_FAMILIES, PartitionStore
from processor.transport.base import Outbound, TopicPartition, TopicSpec
from processor.transport.embedded import EmbeddedTransport
from processor.transport.fact_batches import first_batch_size
from tests.unit.test_reduce_laws import Event, events, simulate

#: Fact types the compiled fold does not cover (yet): a batch holding one is folded in Python.
PYTHON_ONLY = frozenset(
    {
        RunRedriven,
        RunQuarantined,
        RunReleased,
        NodeReady,
        NodeSkipped,
        NodeSettled,
        RouteDecided,
        CatchDecided,
        GraphSettled,
        FanOutItemSettled,
        BoundaryInteractionQueued,
        EventEmitted,
        ChildRunLinked,
        ScheduledRunLinked,
    }
)

TOPIC = "runs.facts"
FACTS = TopicPartition(TOPIC, 0)

requires_native = pytest.mark.skipif(
    not native_fold.native_fold_available() and os.environ.get("CI") != "true",
    reason="processor_native is not installed (make installs it where cargo is found)",
)


def test_the_compiled_fold_is_installed_in_ci() -> None:
    if os.environ.get("CI") != "true":
        pytest.skip("only CI insists on the compiled fold")
    assert native_fold.native_fold_available(), "make must install native/ (cargo missing?)"


class _Header:
    """Header fields for a run's next fact."""

    def __init__(self, run_id: str) -> None:
        self.run_id, self.seq = run_id, 0

    def __call__(self, key: str) -> dict[str, Any]:
        self.seq += 1
        return {
            "run_id": self.run_id,
            "seq": self.seq,
            "fact_key": key,
            "time_ms": 1_000 + self.seq * 10,
            "cause_id": f"cause-{self.seq}",
        }


def _every_fact_type() -> list[FactHeader]:
    """Runs that between them use every fact type, every timer kind and a claim."""
    a = _Header("run-a-\u00e9\u6f22")
    run_a: list[FactHeader] = [
        RunSubmitted(
            **a("submitted"),
            pipeline="p",
            pipeline_version=1,
            input=b"in\x00\xff",
            idempotency_key='key "\u00e9\U0001f600"\n',
            fingerprint="fp",
            submitted_ms=900,
            deadline_ms=10_000_000,
            traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ),
        SegmentAttemptStarted(
            **a("a1"), segment=0, attempt=1, generation=1, first_step=0, expires_ms=5_000
        ),
        StepCompleted(**a("s0"), segment=0, attempt=1, generation=1, step=0, output=b"o0"),
        SegmentFailed(
            **a("f1"),
            segment=0,
            attempt=1,
            generation=1,
            step=1,
            error="boom\n\u00e9",
            error_type="E",
            retryable=True,
            reason="eligible",
        ),
        RetryScheduled(**a("r1"), segment=0, attempt=2, due_ms=6_000, reason="eligible"),
        SegmentAttemptStarted(
            **a("a2"), segment=0, attempt=2, generation=2, first_step=1, expires_ms=7_000
        ),
        StepCompleted(**a("s1"), segment=0, attempt=2, generation=2, step=1, output=b"o1"),
        SegmentSuspended(
            **a("susp"),
            segment=0,
            attempt=2,
            generation=2,
            step=2,
            boundary=1,
            kind="await",
            target="pay",
            itemized=True,
            items=2,
            on_timeout="fail",
        ),
        *(
            BoundaryInteractionDispatched(
                **a(f"i{item}"),
                boundary=1,
                interaction=f"i{item}",
                item_index=item,
                target="pay",
                request=b"r",
                deadline_ms=9_000 + item,
                token_digest=bytes([item, 255]),
                epoch=1,
            )
            for item in (0, 1)
        ),
        BoundaryDispatchCompleted(**a("dispatched"), boundary=1, interactions=2),
        BoundaryCompletionAdmitted(
            **a("c0"),
            boundary=1,
            interaction="i0",
            item_index=0,
            source="s",
            outcome="success",
            payload=b"paid",
            content_type="application/json",
            payload_digest=b"\x01\x02",
        ),
        InteractionTimedOut(**a("t1"), boundary=1, interaction="i1", item_index=1, deadline_ms=1),
        BoundaryCompletionAdmitted(
            **a("c-unknown"),
            boundary=1,
            interaction="nope",
            item_index=5,
            source="s",
            outcome="failure",
            payload=b"",
            content_type="text/plain",
            error="late",
            payload_digest=b"",
        ),
        ContinuationSegmentCreated(**a("cont"), boundary=1, segment=1, first_step=2, input=b"c"),
        SegmentAttemptStarted(
            **a("a3"), segment=1, attempt=1, generation=3, first_step=2, expires_ms=9_500
        ),
        StepCompleted(**a("s2"), segment=1, attempt=1, generation=3, step=2, output=b"o2"),
        SegmentCompleted(**a("done"), segment=1, attempt=1, generation=3, last_step=2),
        TerminalPublicationPrepared(**a("pub"), topic="out", idempotency_key="pub-1"),
        TerminalPublicationCompleted(**a("pubd"), topic="out", idempotency_key="pub-1"),
        RunSucceeded(**a("ok"), result=b"res"),
    ]
    b = _Header("run-b")
    run_b: list[FactHeader] = [
        RunSubmitted(**b("submitted"), pipeline="p", pipeline_version=2, input=b"", submitted_ms=1),
        SegmentAttemptStarted(
            **b("a1"), segment=0, attempt=1, generation=1, first_step=0, expires_ms=5_000
        ),
        AttemptOutcomeUnknown(
            **b("unknown"), kind="step", segment=0, attempt=1, generation=1, step=0
        ),
        AttemptResolved(
            **b("resolved"),
            kind="step",
            segment=0,
            attempt=1,
            generation=1,
            action="retry",
            idempotency_key="op-1",
            fingerprint="f",
            response='{"ok": true}',
        ),
        RunStopRequested(**b("stop"), reason="cancelled", detail="by user"),
        CompensationStarted(**b("comp"), steps=(1, 0)),
        CompensationAttemptStarted(**b("ca1"), step=1, attempt=1, generation=1, expires_ms=8_000),
        CompensationAttemptFailed(
            **b("cf1"),
            step=1,
            attempt=1,
            generation=1,
            error="x",
            error_type="E",
            retry_due_ms=8_500,
            reason="eligible",
        ),
        CompensationAttemptStarted(**b("ca2"), step=1, attempt=2, generation=2, expires_ms=9_000),
        CompensationStepCompleted(**b("cc1"), step=1, attempt=2, generation=2),
        CompensationStepSkipped(**b("cs0"), step=0, reason="no compensator"),
        RunStopped(**b("stopped"), execution="Cancelled", recovery="Compensated", detail="d"),
    ]
    c = _Header("run-c")
    run_c: list[FactHeader] = [
        RunSubmitted(
            **c("submitted"),
            pipeline="p",
            pipeline_version=1,
            input=b"x",
            idempotency_key="key-c",
            submitted_ms=1,
        ),
        SegmentAttemptStarted(
            **c("a1"), segment=0, attempt=1, generation=1, first_step=0, expires_ms=5_000
        ),
        CompensationStarted(**c("comp"), steps=(0,)),
        CompensationAttemptStarted(**c("ca1"), step=0, attempt=1, generation=1, expires_ms=1),
        CompensationAttemptFailed(
            **c("cf1"), step=0, attempt=1, generation=1, error="x", error_type="E"
        ),
        RunFailed(
            **c("failed"),
            error="e",
            error_type="E",
            step=0,
            attempts=3,
            recovery="PartiallyCompensated",
            reason="attempts_exhausted",
        ),
    ]
    d = _Header("run-d")
    orphan = StepCompleted(**d("orphan"), segment=0, attempt=1, generation=1, step=0, output=b"")
    run_d: list[FactHeader] = [
        orphan,  # before its run's submission: folded by nobody, kept in history
        RunSubmitted(**d("submitted"), pipeline="p", pipeline_version=1, input=b"", submitted_ms=1),
        SegmentAttemptStarted(
            **d("a1"), segment=0, attempt=1, generation=1, first_step=0, expires_ms=5_000
        ),
        RetryScheduled(**d("r1"), segment=0, attempt=2, due_ms=6_000),
        RunStopRequested(**d("stop"), reason="timed_out", detail="deadline"),
        RunSubmitted(  # a second submission only advances the version
            **d("again"), pipeline="p", pipeline_version=1, input=b"", submitted_ms=1
        ),
        run_a[2],  # another run's fact, folded into its own run (a duplicate there)
    ]
    e = _Header("run-e")
    run_e: list[FactHeader] = [  # left waiting: its timers stay in the due index
        RunSubmitted(
            **e("submitted"),
            pipeline="p",
            pipeline_version=1,
            input=b"",
            submitted_ms=1,
            deadline_ms=99_000,
        ),
        SegmentAttemptStarted(
            **e("a1"), segment=0, attempt=1, generation=1, first_step=0, expires_ms=5_000
        ),
        SegmentSuspended(
            **e("susp"),
            segment=0,
            attempt=1,
            generation=1,
            step=0,
            boundary=1,
            kind="await",
            target="t",
            itemized=False,
            items=1,
            on_timeout="fail",
        ),
        BoundaryInteractionDispatched(
            **e("i0"),
            boundary=1,
            interaction="i0",
            item_index=0,
            target="t",
            request=b"",
            deadline_ms=12_345,
            token_digest=b"\x00",
            epoch=1,
        ),
        StepCompleted(**e("s0"), segment=0, attempt=1, generation=1, step=0, output=b"x"),
    ]
    run_e.append(run_e[-1])  # the same fact twice: the second changes nothing
    f = _Header("run-f")
    attempt = {"segment": 1, "attempt": 1, "generation": 1, "step": 0}
    again = {"segment": 1, "attempt": 2, "generation": 2, "step": 0}
    run_f: list[FactHeader] = [
        RunSubmitted(**f("submitted"), pipeline="p", pipeline_version=1, input=b"", submitted_ms=1),
        SegmentAttemptStarted(
            **f("a1"), segment=1, attempt=1, generation=1, first_step=0, expires_ms=None
        ),
        AttemptStepStarted(
            **f("st1"), **attempt, worker_id="w1", expires_ms=8_000, heartbeat_due_ms=2_000
        ),
        AttemptHeartbeatRecorded(**f("hb1"), **attempt, heartbeat_due_ms=2_500),
        AttemptStepStarted(
            **f("st2"), **attempt, worker_id="w2", expires_ms=9_000, redelivered=True
        ),
        AttemptLost(**f("lost"), **attempt, cause="heartbeat_timeout", losses=2),
        SegmentAttemptStarted(
            **f("a2"), segment=1, attempt=2, generation=2, first_step=0, expires_ms=None
        ),
        AttemptStepStarted(
            **f("st3"), **again, worker_id="w\u00e9", expires_ms=19_000, heartbeat_due_ms=12_000
        ),
        AttemptHeartbeatRecorded(**f("hb2"), **again, heartbeat_due_ms=13_000),
    ]
    h = _Header("run-h")
    run_h: list[FactHeader] = [  # asleep: its sleep timer stays in the due index
        RunSubmitted(**h("submitted"), pipeline="p", pipeline_version=1, input=b"", submitted_ms=1),
        SegmentAttemptStarted(
            **h("a1"), segment=1, attempt=1, generation=1, first_step=0, expires_ms=5_000
        ),
        StepCompleted(**h("s0"), segment=1, attempt=1, generation=1, step=0, output=b"o"),
        SleepStarted(**h("sleep"), segment=1, attempt=1, generation=1, step=1, wake_ms=77_000),
    ]
    g = _Header("run-g")
    run_g: list[FactHeader] = [  # a sleep that wakes, one a stop fences, retry reasons
        RunSubmitted(**g("submitted"), pipeline="p", pipeline_version=1, input=b"", submitted_ms=1),
        SegmentAttemptStarted(
            **g("a1"), segment=1, attempt=1, generation=1, first_step=0, expires_ms=5_000
        ),
        SleepStarted(**g("sleep1"), segment=1, attempt=1, generation=1, step=0, wake_ms=6_000),
        SleepCompleted(**g("woke1"), segment=1, step=0, wake_ms=6_000),
        StepCompleted(**g("s0"), segment=1, attempt=1, generation=1, step=0, output=b""),
        ContinuationSegmentCreated(**g("cont"), boundary=1, segment=2, first_step=1, input=b""),
        SegmentAttemptStarted(
            **g("a2"), segment=2, attempt=1, generation=1, first_step=1, expires_ms=7_000
        ),
        AttemptOutcomeUnknown(
            **g("unknown"), kind="forward", segment=2, attempt=1, generation=1, step=1
        ),
        AttemptResolved(
            **g("resolved"),
            kind="forward",
            segment=2,
            attempt=1,
            generation=1,
            action="retry",
            idempotency_key="op-g",
            fingerprint="f",
            response="{}",
        ),
        SegmentAttemptStarted(
            **g("a3"), segment=2, attempt=1, generation=2, first_step=1, expires_ms=8_000
        ),
        SegmentFailed(
            **g("f3"),
            segment=2,
            attempt=1,
            generation=2,
            step=1,
            error="e",
            error_type="E",
            retryable=True,
            reason="eligible",
        ),
        RetryScheduled(**g("r3"), segment=2, attempt=2, due_ms=8_500, reason="eligible"),
        RunStopRequested(**g("stop"), reason="timed_out", detail="deadline"),
        SleepStarted(**g("sleep2"), segment=3, attempt=1, generation=1, step=2, wake_ms=9_000),
        RunStopRequested(**g("stop2"), reason="cancelled", detail="again"),
    ]
    i = _Header("run-i")
    run_i: list[FactHeader] = [  # left blocked: its row stays in the runs index
        RunSubmitted(**i("submitted"), pipeline="p", pipeline_version=3, input=b"", submitted_ms=2),
        RunDefinitionBlocked(
            **i("b1"),
            segment=1,
            attempt=1,
            generation=1,
            first_step=0,
            step_attempts=0,
            reason="no_live_worker",
            detail="no live worker loads pipeline 'p' v3",
        ),
    ]
    j = _Header("run-j")
    run_j: list[FactHeader] = [  # refused by a worker, dispatched again, blocked, cancelled
        RunSubmitted(**j("submitted"), pipeline="p", pipeline_version=2, input=b"", submitted_ms=3),
        SegmentAttemptStarted(
            **j("a1"), segment=1, attempt=1, generation=1, first_step=0, expires_ms=5_000
        ),
        RunDefinitionBlocked(
            **j("b2"),
            segment=1,
            attempt=1,
            generation=2,
            first_step=0,
            step_attempts=0,
            reason="worker_lacks_version",
            worker_id="w-1",
        ),
        SegmentAttemptStarted(
            **j("a2"), segment=1, attempt=1, generation=2, first_step=0, expires_ms=6_000
        ),
        StepCompleted(**j("s0"), segment=1, attempt=1, generation=2, step=0, output=b"o"),
        RunDefinitionBlocked(
            **j("b3"),
            segment=1,
            attempt=1,
            generation=3,
            first_step=1,
            step_attempts=1,
            reason="worker_lacks_version",
        ),
        RunStopRequested(**j("stop"), reason="cancelled", detail="by user"),
        RunStopped(**j("stopped"), execution="Cancelled", recovery="NotRequired", detail=""),
    ]
    runs = [run_a, run_b, run_c, run_d, run_e, run_f, run_g, run_h, run_i, run_j]
    runs += _compensator_progress()
    runs.append(_event_wait_run())
    runs.append(_stopping_parent())
    runs.append(_failed_parent())
    interleaved = []
    for index in range(max(map(len, runs))):
        interleaved += [run[index] for run in runs if index < len(run)]
    return interleaved


#: The registration of ``_event_wait_run``'s wait (model/event_waits.py).
EVENT_TARGET = event_waits.registration_target("paid", {"order": "o-1", "region": "eu"}, "order")


def _suspended_at(
    h: _Header, kind: str, target: str, items: int, dispatched: list[tuple[str, bytes, int]]
) -> list[FactHeader]:
    """A run's first attempt suspended at boundary 1 (``kind`` at ``target``), and its
    interactions dispatched: (target, request, deadline) for each item."""
    facts: list[FactHeader] = [
        RunSubmitted(**h("submitted"), pipeline="p", pipeline_version=1, input=b"", submitted_ms=1),
        SegmentAttemptStarted(
            **h("a1"), segment=0, attempt=1, generation=1, first_step=0, expires_ms=5_000
        ),
        SegmentSuspended(
            **h("susp"),
            segment=0,
            attempt=1,
            generation=1,
            step=0,
            boundary=1,
            kind=kind,
            target=target,
            itemized=items > 1,
            items=items,
            on_timeout="fail",
        ),
    ]
    for item, (interaction_target, request, deadline_ms) in enumerate(dispatched):
        facts.append(
            BoundaryInteractionDispatched(
                **h(f"i{item}"),
                boundary=1,
                interaction=f"i{item}",
                item_index=item,
                target=interaction_target,
                request=request,
                deadline_ms=deadline_ms,
                token_digest=b"\x00",
                epoch=1,
            )
        )
    return facts


def _event_wait_run() -> list[FactHeader]:
    """A run left waiting for an event by key: listed as waiting on ``event:paid`` and
    found by (event, key) in the runs index."""
    wait = (EVENT_TARGET, b'{"order":"o-1","region":"eu"}', 12_345)
    return _suspended_at(_Header("run-event"), "event", "paid", 1, [wait])


def _parent_after_its_first_child(
    k: _Header, deadline_ms: int, outcome: str, error: str | None = None
) -> list[FactHeader]:
    """A parent waiting at a child step for two children, the first one's ``outcome``
    admitted, the second still open (its interaction's deadline ``deadline_ms + 1``)."""
    children = [("kid", b"{}", deadline_ms), ("kid", b"{}", deadline_ms + 1)]
    return [
        *_suspended_at(k, "child", "kid", 2, children),
        BoundaryDispatchCompleted(**k("dispatched"), boundary=1, interactions=2),
        BoundaryCompletionAdmitted(
            **k("c0"),
            boundary=1,
            interaction="i0",
            item_index=0,
            source="child",
            outcome=outcome,
            payload=b"{}" if error is None else b"null",
            content_type="application/json",
            payload_digest=b"\x01" if error is None else b"\x02",
            error=error,
        ),
    ]


def _stopping_parent() -> list[FactHeader]:
    """A parent cancelled while one of its two children is still open: its stop waits
    for that child (``waits.children_open``), so it stays suspended, the open child's
    interaction timer still armed."""
    k = _Header("run-parent")
    return [
        *_parent_after_its_first_child(k, 50_000, "success"),
        RunStopRequested(**k("stop"), reason="cancelled", detail="by user"),
    ]


def _failed_parent() -> list[FactHeader]:
    """A parent whose first child failed its child step while the second is open: the
    step failed (idle), the stop waits for that child (``waits.stop_held_by_children``),
    its interaction timer still armed."""
    k = _Header("run-failed-parent")
    return [
        *_parent_after_its_first_child(k, 60_000, "failure", "child run k0 failed"),
        SegmentFailed(
            **k("failed"),
            segment=0,
            attempt=1,
            generation=1,
            step=0,
            error="item 0: child run k0 failed",
            error_type="BoundaryFailure",
            retryable=False,
            reason="boundary_failed",
        ),
        RunStopRequested(**k("stop"), reason="failed", detail="item 0: child run k0 failed"),
    ]


def _unwinding(h: _Header) -> list[FactHeader]:
    """A run that completed step 0, was cancelled and began to compensate it."""
    return [
        RunSubmitted(**h("submitted"), pipeline="p", pipeline_version=1, input=b"", submitted_ms=1),
        SegmentAttemptStarted(
            **h("a1"), segment=1, attempt=1, generation=1, first_step=0, expires_ms=None
        ),
        StepCompleted(**h("s0"), segment=1, attempt=1, generation=1, step=0, output=b"o"),
        RunStopRequested(**h("stop"), reason="cancelled", detail="by user"),
        CompensationStarted(**h("comp"), steps=(0,)),
    ]


def _compensator_progress() -> list[list[FactHeader]]:
    """Runs whose compensators are reported started, heartbeat and are lost (``kind``
    compensate): left running (their timers in the due index), waiting to be retried
    and Unknown."""
    k, q, m = (_Header(name) for name in ("run-k", "run-q", "run-m"))
    runs = [_unwinding(k), _unwinding(q), _unwinding(m)]
    first = {"segment": 0, "attempt": 1, "generation": 1, "step": 0, "kind": "compensate"}
    second = {**first, "generation": 2}
    runs[0] += [  # started and heartbeating: compensation and heartbeat timers
        CompensationAttemptStarted(**k("ca1"), step=0, attempt=1, generation=1, expires_ms=None),
        AttemptStepStarted(
            **k("st1"), **first, worker_id="w\u00e9", expires_ms=40_000, heartbeat_due_ms=12_000
        ),
        AttemptHeartbeatRecorded(**k("hb1"), **first, heartbeat_due_ms=13_000),
    ]
    runs[1] += [  # not started in time, dispatched again: a schedule-to-start timer
        CompensationAttemptStarted(**q("ca1"), step=0, attempt=1, generation=1, expires_ms=7_000),
        AttemptLost(**q("lost"), **first, cause="schedule_to_start_timeout", losses=1),
        CompensationAttemptStarted(**q("ca2"), step=0, attempt=1, generation=2, expires_ms=8_000),
    ]
    runs[2] += [  # started twice, failed, retried, started, then Unknown
        CompensationAttemptStarted(**m("ca1"), step=0, attempt=1, generation=1, expires_ms=None),
        AttemptStepStarted(
            **m("st1"), **first, worker_id="w1", expires_ms=30_000, heartbeat_due_ms=3_000
        ),
        AttemptStepStarted(
            **m("st2"), **first, worker_id="w2", expires_ms=31_000, redelivered=True
        ),
        CompensationAttemptFailed(
            **m("cf1"),
            step=0,
            attempt=1,
            generation=1,
            error="x",
            error_type="E",
            retry_due_ms=9_000,
            reason="eligible",
        ),
        CompensationAttemptStarted(**m("ca2"), step=0, attempt=2, generation=2, expires_ms=None),
        AttemptStepStarted(
            **m("st3"), **second, worker_id="w3", expires_ms=50_000, heartbeat_due_ms=20_000
        ),
        AttemptOutcomeUnknown(
            **m("unknown"), kind="compensate", segment=0, attempt=2, generation=2, step=0
        ),
    ]
    return runs


def _log(tmp_path: Path, values: list[bytes]) -> EmbeddedTransport:
    transport = EmbeddedTransport(tmp_path / "log", default_partitions=1)
    admin = transport.admin()
    admin.create_topics([TopicSpec(TOPIC, 1)])
    admin.close()
    producer = transport.producer()
    for value in values:
        producer.produce(Outbound(TOPIC, b"k", value))
    producer.close()
    return transport


_Rows = dict[str, list[Any]]
#: The column families a fold writes (all but ``meta``, which holds the facts offset).
_FOLDED = tuple(family for family in COLUMN_FAMILIES if family != "meta")


def _rows(store: PartitionStore) -> _Rows:
    """Every row of every column family, and each run's history entries whatever the
    chunks (``histories``, under "history by run")."""
    rows: _Rows = {family: list(store.items(family)) for family in COLUMN_FAMILIES}
    rows["history by run"] = list(store.histories())
    return rows


class _Counting:
    """Counts the batches the compiled fold folded (and those it declined)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.folded = self.declined = 0
        original = native_fold.NativeFold.fold

        def counting(fold: native_fold.NativeFold, values: Any, facts_offset: int) -> bool:
            done = original(fold, values, facts_offset)
            self.folded += done
            self.declined += not done
            return done

        monkeypatch.setattr(native_fold.NativeFold, "fold", counting)


def _catch_up(
    transport: EmbeddedTransport, path: Path, plan: list[tuple[int, bool]], batch_size: int
) -> _Rows:
    """Catch a fresh store up in steps: (end offset, native) each; then its rows, and
    the runs the steps said began (under "runs started": every run, in a fresh store)."""
    reader = transport.reader()
    store = PartitionStore(path)
    try:
        started = 0
        for end, native in plan:
            caught = catch_up(store, reader, FACTS, end=end, batch_size=batch_size, native=native)
            started += caught.runs_started
        rows = _rows(store)
        assert started == len(rows["runs"])
        return rows | {"runs started": [started]}
    finally:
        store.close()
        reader.close()


def _reference(transport: EmbeddedTransport, path: Path, batch_size: int) -> _Rows:
    """The rows the Python fold writes, in batches of ``batch_size`` (which decides
    where history chunks begin)."""
    return _catch_up(transport, path, [(10**9, False)], batch_size)


@requires_native
@pytest.mark.parametrize("batch_size", [1, 3, 1000])
def test_every_fact_type_folds_to_the_same_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch_size: int
) -> None:
    facts = _every_fact_type()
    assert {type(fact) for fact in facts} >= set(FACT_TYPES) - PYTHON_ONLY
    transport = _log(tmp_path, [encode(fact) for fact in facts])
    expected = _reference(transport, tmp_path / "python", batch_size)
    assert expected["due"] and expected["runs"]
    # The runs index: every run's rows, and the rows of a run waiting at a boundary.
    waiting = keys.index_prefix("waiting", ("t",))
    assert len(expected["index"]) > 2 * len(expected["runs"])
    assert any(key.startswith(waiting) for key, _ in expected["index"])
    for kind, parts in (("waiting", ("event:paid",)), ("event_key", ("paid", "o-1"))):
        assert any(key.startswith(keys.index_prefix(kind, parts)) for key, _ in expected["index"])
    # The stopping parents (cancelled; failed by a child) still wait for their open
    # child, whose timer stays armed.
    for parent in ("run-parent", "run-failed-parent"):
        parent_timers = [
            entry
            for entry in (keys.decode_due(key) for key, _ in expected["due"])
            if entry.run_id == parent
        ]
        assert [(e.kind, e.ordinal) for e in parent_timers] == [("interaction_timeout", 1)]
    # Runs with an idempotency key (before format 4, they had claims rows: none now).
    assert any(isinstance(fact, RunSubmitted) and fact.idempotency_key for fact in facts)
    counting = _Counting(monkeypatch)
    rebuilt = _catch_up(transport, tmp_path / "native", [(10**9, True)], batch_size)
    assert rebuilt == expected
    assert counting.folded == _batches_read(len(facts), batch_size) and counting.declined == 0


@requires_native
def test_compensator_progress_folds_to_the_same_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Start reports, heartbeats and losses of compensators (``kind`` compensate) fold,
    timers included, as the Python reducers fold them."""
    runs = _compensator_progress()
    timers = {run[0].run_id: sorted(e.kind for e in due_entries(fold(run))) for run in runs}
    assert timers == {
        "run-k": ["compensation_timeout", "heartbeat_timeout"],
        "run-q": ["schedule_to_start_timeout"],
        "run-m": [],
    }
    facts = [fact for run in runs for fact in run]
    transport = _log(tmp_path, [encode(fact) for fact in facts])
    expected = _reference(transport, tmp_path / "python", batch_size=4)
    assert len(expected["due"]) == 3
    counting = _Counting(monkeypatch)
    assert _catch_up(transport, tmp_path / "native", [(10**9, True)], batch_size=4) == expected
    assert counting.folded == _batches_read(len(facts), 4) and counting.declined == 0


@requires_native
def test_a_store_written_in_python_goes_on_with_the_compiled_fold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compiled fold reads runs stored by pydantic (not carried), and the reverse."""
    facts = _every_fact_type()
    transport = _log(tmp_path, [encode(fact) for fact in facts])
    thirds = [len(facts) // 3, 2 * len(facts) // 3, len(facts)]
    # The same steps all in Python (the steps' ends decide where history chunks begin).
    expected = _catch_up(transport, tmp_path / "python", [(end, False) for end in thirds], 4)
    counting = _Counting(monkeypatch)
    plan = [(thirds[0], False), (thirds[1], True), (thirds[2], False)]
    assert _catch_up(transport, tmp_path / "mixed", plan, batch_size=4) == expected
    assert counting.folded > 0


def _old_run_submitted(run_id: str) -> bytes:
    """A RunSubmitted in the schema RunSubmitted had before (kept in schemas/history)."""
    path = next((SCHEMA_DIR / "history").glob("RunSubmitted.*.avsc"))
    schema = fastavro.parse_schema(json.loads(path.read_text()))
    record = {
        "run_id": run_id,
        "seq": 1,
        "fact_key": "submitted",
        "time_ms": 5,
        "cause_id": "c",
        "pipeline": "p",
        "pipeline_version": 1,
        "input": b"old",
        "idempotency_key": None,
        "fingerprint": None,
        "submitted_ms": 5,
    }
    names = {field["name"] for field in schema["fields"]}
    out = io.BytesIO()
    out.write(b"\xc3\x01" + bytes.fromhex(path.name.split(".")[1]))
    fastavro.schemaless_writer(out, schema, {k: v for k, v in record.items() if k in names})
    return out.getvalue()


@requires_native
def test_a_batch_it_does_not_handle_is_folded_in_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fact in an older schema: that batch falls back to Python, the next ones do not."""
    old = _old_run_submitted("run-old")
    assert decode_fact(old).run_id == "run-old"  # the codec still reads it
    later = StepCompleted(
        run_id="run-old",
        seq=2,
        fact_key="s0",
        time_ms=9,
        cause_id="c",
        segment=0,
        attempt=1,
        generation=1,
        step=0,
        output=b"o",
    )
    values = [encode(fact) for fact in _every_fact_type()[:10]]
    values += [old] + [encode(later)] + [encode(fact) for fact in _every_fact_type()[10:]]
    transport = _log(tmp_path, values)
    expected = _reference(transport, tmp_path / "python", batch_size=5)
    counting = _Counting(monkeypatch)
    assert _catch_up(transport, tmp_path / "native", [(10**9, True)], batch_size=5) == expected
    assert counting.declined == 1 and counting.folded == _batches_read(len(values), 5) - 1


@requires_native
@given(events, st.integers(1, 12))
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_simulated_runs_fold_to_the_same_rows(
    tmp_path_factory: pytest.TempPathFactory, script: list[Event], batch_size: int
) -> None:
    sim = simulate(script)
    root = tmp_path_factory.mktemp("sim")
    transport = _log(root, [encode(fact) for fact in sim.facts])
    expected = _reference(transport, root / "python", batch_size)
    rebuilt = _catch_up(transport, root / "native", [(10**9, True)], batch_size)
    assert rebuilt == expected
    # Other batches chunk the histories differently, with the same facts per run.
    other = _reference(transport, root / "other", 7)
    assert rebuilt["history by run"] == other["history by run"]


@requires_native
def test_a_broken_value_in_a_later_run_declines_the_whole_batch(tmp_path: Path) -> None:
    """A value that does not decode, in the run folded last, declines the whole batch,
    with nothing written, and the next batches fold as if it had never been offered."""
    facts = _every_fact_type()
    values = [encode(fact) for fact in facts]
    last_run = list(dict.fromkeys(fact.run_id for fact in facts))[-1]  # folded last
    at = max(i for i, fact in enumerate(facts) if fact.run_id == last_run)
    broken = [*values[:at], values[at][:-1], *values[at + 1 :]]  # a known schema, cut short
    store = PartitionStore(tmp_path / "store")
    try:
        fold = native_fold.NativeFold(store)
        assert not fold.fold(broken, facts_offset=len(values))
        assert store.facts_offset() == 0
        assert all(not list(store.items(family)) for family in ("runs", "history", "due"))
        # The batches the reference below reads: to offset 5, then the journal reader's
        # smaller first read, then the rest.
        second = 5 + first_batch_size(10**6)
        assert fold.fold(values[:5], facts_offset=5)
        assert fold.fold(values[5:second], facts_offset=second)
        assert fold.fold(values[second:], facts_offset=len(values))
        # A declined batch counts no runs as begun either.
        folded = _rows(store) | {"runs started": [fold.runs_started]}
    finally:
        store.close()
    transport = _log(tmp_path, values)
    assert folded == _catch_up(transport, tmp_path / "python", [(5, False), (10**9, False)], 10**6)


@requires_native
def test_records_without_a_value_are_left_out(tmp_path: Path) -> None:
    """A record without a value (a tombstone someone produced to runs.facts) is no fact:
    the compiled fold leaves it out, as catch-up's Python fold does."""
    values = [encode(fact) for fact in _every_fact_type()]
    with_gaps = [None, *values[:3], None, *values[3:], None]
    folded = {}
    for name, batch in (("values", values), ("with gaps", with_gaps)):
        store = PartitionStore(tmp_path / name)
        try:
            assert native_fold.NativeFold(store).fold(batch, facts_offset=len(batch))
            folded[name] = {family: list(store.items(family)) for family in _FOLDED}
        finally:
            store.close()
    assert folded["with gaps"] == folded["values"]
    assert folded["values"]["runs"] and folded["values"]["history"]


@requires_native
def test_into_an_empty_store_it_looks_up_only_runs_it_has_written(tmp_path: Path) -> None:
    """A replay rebuilds into empty stores, where a run the compiled fold has not
    written yet is new: it looks up only runs it wrote in an earlier batch and no longer
    carries. Into a store that holds runs, it looks up every run it does not carry."""
    # Each run's facts in batches of 3, the runs' batches taken in turn: a run is
    # missing from the batch after each of its own.
    by_run: dict[str, list[bytes]] = {}
    for fact in _every_fact_type():
        by_run.setdefault(fact.run_id, []).append(encode(fact))
    chunks = [[facts[at : at + 3] for at in range(0, len(facts), 3)] for facts in by_run.values()]
    batches = [chunk for turn in itertools.zip_longest(*chunks) for chunk in turn if chunk]
    runs_of = [{decode_fact(value).run_id for value in batch} for batch in batches]
    requested: dict[str, list[set[str]]] = {}
    other = RunSubmitted(
        **_Header("run-other")("submitted"),
        pipeline="p",
        pipeline_version=1,
        input=b"",
        submitted_ms=1,
    )
    for name, prior in (("empty", []), ("holding a run", [encode(other)])):
        store = PartitionStore(tmp_path / name)
        asked: list[set[str]] = []

        def load(
            run_keys: list[bytes], store: PartitionStore = store, asked: list[set[str]] = asked
        ) -> list[bytes | None]:
            asked[-1] |= {keys.decode_string_key(key) for key in run_keys}
            return PartitionStore.raw_runs_at(store, run_keys)

        try:
            if prior:
                assert native_fold.NativeFold(store).fold(prior, facts_offset=0)
            store.raw_runs_at = load  # type: ignore[method-assign]
            fold = native_fold.NativeFold(store)
            for batch in batches:
                asked.append(set())
                assert fold.fold(batch, facts_offset=0)
        finally:
            store.close()
        requested[name] = asked
    written: set[str] = set()
    for runs, asked in zip(runs_of, requested["empty"], strict=True):
        assert asked <= written  # never a run new to the store
        written |= runs
    assert any(requested["empty"])  # a run came back after a batch without it
    new_each_batch = [runs - set().union(*runs_of[:i]) for i, runs in enumerate(runs_of)]
    assert all(
        new <= asked for new, asked in zip(new_each_batch, requested["holding a run"], strict=True)
    )


class RunAnnotated(FactHeader):
    """A fact type added after the compiled fold was built: the kernel has never heard
    of it, and only a Python reducer folds it."""

    note: str


def _annotated(fact: RunAnnotated, state: RunState) -> RunChanges:
    return {"error": fact.note}  # any change the rows show


@pytest.fixture
def a_new_fact_type(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[type[RunAnnotated]]:
    """``RunAnnotated`` added as a new fact type is: a model, its schema, an entry in
    FACT_TYPES and a Python reducer; nothing in native/ or store/native_fold.py."""
    schemas = tmp_path / "schemas"
    shutil.copytree(SCHEMA_DIR, schemas)
    declared = json.loads((SCHEMA_DIR / "RunStopRequested.avsc").read_text())
    declared["name"], declared["doc"] = "RunAnnotated", "A note on a run."
    declared["fields"] = [*declared["fields"][:5], {"name": "note", "type": "string"}]
    (schemas / "RunAnnotated.avsc").write_text(json.dumps(declared))
    fact_types = (*FACT_TYPES, RunAnnotated)
    monkeypatch.setattr(codec_module, "FACT_TYPES", fact_types)
    monkeypatch.setattr(native_fold, "FACT_TYPES", fact_types)
    monkeypatch.setattr(native_fold, "SCHEMA_DIR", schemas)
    with_new_type = codec_module.Codec(schemas)
    monkeypatch.setattr(codec_module, "codec", lambda: with_new_type)
    monkeypatch.setattr(native_fold, "codec", lambda: with_new_type)
    # Registered for good (a reducer cannot be unregistered): no other test has the type.
    reduce_module._changes.register(RunAnnotated, _annotated)
    native_fold._covered.cache_clear()
    native_fold._fact_schemas.cache_clear()
    yield RunAnnotated
    native_fold._covered.cache_clear()
    native_fold._fact_schemas.cache_clear()


@requires_native
def test_a_fact_type_it_does_not_know_is_folded_in_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, a_new_fact_type: type[RunAnnotated]
) -> None:
    """The batch holding the new fact type is declined and folded by the Python
    reducers, to the rows the Python fold writes; every other batch by the kernel."""
    assert a_new_fact_type not in native_fold.covered_fact_types()
    assert set(native_fold.covered_fact_types()) == set(FACT_TYPES) - PYTHON_ONLY
    facts = _every_fact_type()
    first = facts[0]
    note = a_new_fact_type(
        run_id=first.run_id, seq=1_000, fact_key="note", time_ms=99_999, cause_id="c", note="n"
    )
    values = [encode(fact) for fact in facts[:7]] + [encode(note)]
    values += [encode(fact) for fact in facts[7:]]
    transport = _log(tmp_path, values)
    expected = _reference(transport, tmp_path / "python", batch_size=4)
    stored = json.loads(dict(expected["runs"])[keys.run_key(first.run_id)])
    assert stored["error"] == "n" and stored["version"] >= 1_000  # the reducer ran
    counting = _Counting(monkeypatch)
    assert _catch_up(transport, tmp_path / "native", [(10**9, True)], batch_size=4) == expected
    assert counting.declined == 1 and counting.folded == _batches_read(len(values), 4) - 1


def _redriven_run() -> list[FactHeader]:
    """A run that fails at step 1, is redriven from step 0 and succeeds."""
    r = _Header("run-redriven")
    started = {"attempt": 1, "first_step": 0}
    return [
        RunSubmitted(
            **r("submitted"),
            pipeline="p",
            pipeline_version=1,
            input=b"{}",
            submitted_ms=900,
        ),
        SegmentAttemptStarted(**r("a1"), segment=1, generation=1, expires_ms=5_000, **started),
        StepCompleted(**r("s0"), segment=1, attempt=1, generation=1, step=0, output=b"o0"),
        SegmentFailed(
            **r("f1"),
            segment=1,
            attempt=1,
            generation=1,
            step=1,
            error="boom",
            error_type="E",
            retryable=False,
        ),
        RunFailed(**r("terminal"), error="boom", error_type="E", step=1, attempts=1),
        RunRedriven(
            **r("redriven/1"),
            redrive=1,
            command_id="cmd-1",
            operator="op",
            reason="fixed",
            from_step=0,
            failed_step=1,
            previous_execution="Failed",
            previous_recovery="NotRequired",
            previous_error="boom",
            previous_error_type="E",
            previous_segment=1,
            previous_attempt=1,
            previous_generation=1,
            previous_attempts=1,
            response="{}",
        ),
        SegmentAttemptStarted(**r("a2"), segment=2, generation=2, expires_ms=9_000, **started),
        StepCompleted(**r("s0'"), segment=2, attempt=1, generation=2, step=0, output=b"p0"),
        StepCompleted(**r("s1'"), segment=2, attempt=1, generation=2, step=1, output=b"p1"),
        SegmentCompleted(**r("c2"), segment=2, attempt=1, generation=2, last_step=1),
        RunSucceeded(**r("terminal'"), result=b"p1"),
    ]


@requires_native
def _batches_read(facts: int, batch_size: int) -> int:
    """How many batches a reader of the journal hands out for ``facts`` single facts:
    a smaller first one (``fact_batches.journal_values``), then ``batch_size`` each."""
    first = first_batch_size(batch_size)
    return 1 + -(-max(0, facts - first) // batch_size)


@pytest.mark.parametrize("batch_size", [1, 4])
def test_a_redriven_run_is_folded_in_python_to_the_same_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch_size: int
) -> None:
    """RunRedriven is not in the compiled fold: its batch, and every later batch that
    touches the redriven run (whose row the kernel cannot read), is folded in Python."""
    redriven, others = _redriven_run(), _every_fact_type()
    values = [encode(fact) for fact in redriven + others]
    transport = _log(tmp_path, values)
    expected = _reference(transport, tmp_path / "python", batch_size)
    stored = json.loads(dict(expected["runs"])[keys.run_key("run-redriven")])
    assert stored["status"] == "succeeded" and "cmd-1" in stored["redrives"]
    counting = _Counting(monkeypatch)
    assert _catch_up(transport, tmp_path / "native", [(10**9, True)], batch_size) == expected
    after_redrive = len(redriven) - 5  # the redrive's batch and those after it, of this run
    assert counting.declined >= -(-after_redrive // batch_size) and counting.folded > 0


@requires_native
def test_a_build_that_writes_other_row_fields_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """An older build (its run rows without fields added since) folds nothing: Python does."""
    import importlib
    import types

    real = importlib.import_module("processor_native")
    assert tuple(real.ROW_FIELDS) == native_fold._ROW_FIELDS  # this build is current
    older = types.SimpleNamespace(FAMILIES=real.FAMILIES, ROW_FIELDS=real.ROW_FIELDS[:-1])
    monkeypatch.setattr(importlib, "import_module", lambda name: older)
    assert native_fold._extension() is None


def _quarantined_run() -> list[FactHeader]:
    """A run quarantined while dispatched (no timer, a 'quarantined' index row), then
    released (its timer back) and succeeded."""
    r = _Header("run-quarantined")
    started = {"attempt": 1, "first_step": 0}
    return [
        RunSubmitted(
            **r("submitted"), pipeline="p", pipeline_version=1, input=b"{}", submitted_ms=900
        ),
        SegmentAttemptStarted(**r("a1"), segment=1, generation=1, expires_ms=5_000, **started),
        RunQuarantined(
            **r("quarantined/3"), source="timer:attempt_timeout", error_type="E", error="x"
        ),
        RunReleased(
            **r("quarantined/3/released"),
            command_id="cmd-1",
            operator="op",
            reason="fixed",
            quarantined_seq=3,
        ),
        StepCompleted(**r("s0"), segment=1, attempt=1, generation=1, step=0, output=b"o0"),
        SegmentCompleted(**r("c1"), segment=1, attempt=1, generation=1, last_step=0),
        RunSucceeded(**r("terminal"), result=b"o0"),
    ]


@requires_native
@pytest.mark.parametrize("batch_size", [1, 2, 4])
def test_a_quarantined_run_is_folded_in_python_to_the_same_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch_size: int
) -> None:
    """RunQuarantined and RunReleased are not in the compiled fold, nor is a quarantined
    run's row: those batches are folded in Python, to the rows the Python fold writes
    (a stop after the quarantine too: its due rows gone, its index row there)."""
    quarantined, others = _quarantined_run(), _every_fact_type()
    for cut in (3, len(quarantined)):
        values = [encode(fact) for fact in quarantined[:cut] + others]
        transport = _log(tmp_path / str(cut), values)
        expected = _reference(transport, tmp_path / str(cut) / "python", batch_size)
        stored = json.loads(dict(expected["runs"])[keys.run_key("run-quarantined")])
        assert ("quarantine" in stored) == (cut == 3)
        counting = _Counting(monkeypatch)
        native = _catch_up(transport, tmp_path / str(cut) / "native", [(10**9, True)], batch_size)
        assert native == expected
        assert counting.declined >= 1 and counting.folded > 0


def _graph_run() -> list[FactHeader]:
    """A graph run: two steps in parallel lanes (one retried), a switch that routes, a
    caught failure, a skip, then success."""
    g = _Header("run-graph")

    def attempt(key: str, segment: int, generation: int = 1) -> FactHeader:
        return SegmentAttemptStarted(
            **g(key),
            segment=segment,
            attempt=generation,
            generation=generation,
            first_step=segment - 1,
            expires_ms=5_000,
        )

    return [
        RunSubmitted(
            **g("submitted"), pipeline="g", pipeline_version=1, input=b"{}", submitted_ms=900
        ),
        NodeReady(**g("n0"), step=0, segment=1, input=b"{}"),
        attempt("a1", 1),
        NodeReady(**g("n1"), step=1, segment=2, input=b"{}"),
        attempt("a2", 2),
        SegmentFailed(
            **g("f2"),
            segment=2,
            attempt=1,
            generation=1,
            step=1,
            error="e",
            error_type="E",
            retryable=True,
            reason="eligible",
        ),
        RetryScheduled(**g("r2"), segment=2, attempt=2, due_ms=6_000, reason="eligible"),
        StepCompleted(**g("s0"), segment=1, attempt=1, generation=1, step=0, output=b'"b"'),
        SegmentCompleted(**g("c1"), segment=1, attempt=1, generation=1, last_step=0),
        RouteDecided(**g("route0"), step=0, routes=("b",)),
        NodeSettled(**g("settled0"), step=0, segment=1, status="succeeded", attempts=1),
        NodeSkipped(**g("skip"), step=3, reason="predicate_false"),
        attempt("a2b", 2, 2),
        SegmentFailed(
            **g("f2b"),
            segment=2,
            attempt=2,
            generation=2,
            step=1,
            error="e",
            error_type="E",
            retryable=False,
            reason="not_retryable",
        ),
        NodeSettled(
            **g("settled1"),
            step=1,
            segment=2,
            status="failed",
            error="e",
            error_type="E",
            attempts=2,
        ),
        CatchDecided(**g("caught1"), step=1, handler=2),
        NodeReady(**g("n2"), step=2, segment=3, input=b"{}"),
        attempt("a3", 3),
        StepCompleted(**g("s2"), segment=3, attempt=1, generation=1, step=2, output=b"2"),
        SegmentCompleted(**g("c3"), segment=3, attempt=1, generation=1, last_step=2),
        NodeSettled(**g("settled2"), step=2, segment=3, status="succeeded", attempts=1),
        GraphSettled(**g("graph"), outcome="succeeded", result_step=2),
        RunSucceeded(**g("terminal"), result=b"2"),
    ]


@requires_native
@pytest.mark.parametrize("batch_size", [1, 3, 1000])
def test_a_graph_run_is_folded_in_python_to_the_same_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch_size: int
) -> None:
    """The facts of graph runs are not in the compiled fold, nor is a graph run's row
    (its lanes and steps): those batches are folded in Python, to the same rows, and
    the lanes' timers are in the due index while they run."""
    graph, others = _graph_run(), _every_fact_type()
    for cut in (6, len(graph)):
        values = [encode(fact) for fact in graph[:cut] + others]
        transport = _log(tmp_path / str(cut), values)
        expected = _reference(transport, tmp_path / str(cut) / "python", batch_size)
        stored = json.loads(dict(expected["runs"])[keys.run_key("run-graph")])
        assert ("lanes" in stored) == (cut == 6)
        assert stored["nodes"]["0"].get("status", "running") == (
            "running" if cut == 6 else "succeeded"
        )
        counting = _Counting(monkeypatch)
        native = _catch_up(transport, tmp_path / str(cut) / "native", [(10**9, True)], batch_size)
        assert native == expected
        assert counting.declined >= 1
        assert counting.folded > 0 or batch_size >= len(values)
