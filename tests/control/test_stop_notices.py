"""Stop that reaches the work: notices on segments.control and boundary.requests."""

from __future__ import annotations

from processor.facts.codec import codec
from processor.facts.models import (
    BoundaryCompletion,
    BoundaryRequest,
    RunStopped,
    StopNotice,
)
from processor.facts.topics import TopicName
from processor.transport.base import Record
from processor.transport.partitioner import partition_for
from tests.apps.support import read_topic
from tests.control.control_support import Control


def _stop_notices(ctl: Control, run_id: str) -> list[tuple[Record, StopNotice]]:
    topology = ctl.h.deployment.topology
    found = []
    for record in read_topic(ctl.h.reader, ctl.h.name(TopicName.CONTROL), topology.partitions):
        message = codec().decode(record.value)
        if isinstance(message, StopNotice) and message.run_id == run_id:
            found.append((record, message))
    return found


def test_a_stop_while_a_step_runs_sends_a_notice_to_segments_control(ctl: Control) -> None:
    run_id = ctl.submit("booking", {"id": "sn-1"})
    item = ctl.work(run_id)  # running
    ctl.cancel(run_id, "no longer wanted")
    ctl.drive(lambda: _stop_notices(ctl, run_id), "a stop notice")
    [(record, notice)] = _stop_notices(ctl, run_id)
    partitions = ctl.h.deployment.topology.partitions
    assert record.key == run_id.encode()
    assert record.partition == partition_for(run_id.encode(), partitions)
    assert (notice.segment, notice.attempt, notice.generation, notice.kind) == (
        item.segment,
        item.attempt,
        item.generation,
        "forward",
    )
    assert (notice.reason, notice.at_ms) == ("cancelled", ctl.now)
    ctl.complete(item)  # the attempt settles as before; the notice changed nothing else
    assert ctl.play(run_id).status == "cancelled"
    assert len(_stop_notices(ctl, run_id)) == 1  # one stop, one notice


def test_a_stop_at_an_await_sends_a_cancel_notice_per_open_interaction(ctl: Control) -> None:
    run_id = ctl.submit("survey", {"n": 7, "items": 2})
    ctl.complete(ctl.work(run_id))  # suspended at the itemized await: two requests
    requests = ctl.drive(lambda: len(ctl.requests_of(run_id)) == 2 and ctl.requests_of(run_id), "2")
    ctl.complete_interaction(requests[0], {"yes": True})  # one answered, one still open
    ctl.drive(
        lambda: ctl.state(run_id).interactions[requests[0].interaction].status == "admitted",
        "the first answer admitted",
    )
    ctl.cancel(run_id)
    notices = ctl.drive(lambda: ctl.cancel_notices_of(run_id), "a cancel notice")
    assert [(n.interaction, n.item_index, n.target, n.cancel) for n in notices] == [
        (requests[1].interaction, 1, requests[1].target, "cancelled")
    ]
    assert (notices[0].request, notices[0].resume_token) == (b"", "")
    assert ctl.terminal(run_id).status == "cancelled"
    assert ctl.one(run_id, RunStopped).execution == "Cancelled"
    assert _stop_notices(ctl, run_id) == []  # nothing was running


def test_the_responder_surfaces_a_cancel_notice_and_does_not_answer_it() -> None:
    from processor.clients.external import Responder
    from processor.facts.codec import encode
    from processor.transport.topology import Topology

    answered: list[BoundaryRequest] = []
    cancelled: list[BoundaryRequest] = []
    responder = Responder(
        None,  # type: ignore[arg-type]  # _answer needs no transport
        Topology(),
        {"svc": lambda request, value: answered.append(request)},
        on_cancel=cancelled.append,
    )
    notice = BoundaryRequest(
        run_id="r",
        boundary=1,
        interaction="b1.0",
        item_index=0,
        target="svc",
        request=b"",
        deadline_ms=0,
        resume_token="",
        cancel="timed_out",
    )
    record = Record("boundary.requests", 0, 0, b"r", encode(notice), ())

    class NoClient:
        def send(self, *args: object, **kwargs: object) -> BoundaryCompletion:
            raise AssertionError("a cancel notice is never answered")

    responder._answer([record], NoClient())  # type: ignore[arg-type]
    assert (cancelled, answered, responder.cancelled, responder.answered) == ([notice], [], 1, 0)
