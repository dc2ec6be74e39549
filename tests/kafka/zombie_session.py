"""A processor session that can be frozen mid-transaction (a helper process, no tests here).

``python -m tests.kafka.zombie_session GROUP INPUT OUTPUT [inputs|timers]``
(settings from the ``PROCESSOR_*`` environment): joins GROUP on INPUT, polls
until it has records, opens a transaction holding one record for OUTPUT, prints
``READY`` and waits for a line on stdin. The test freezes it there (SIGSTOP),
lets another member take INPUT over, wakes it and asks it to commit: with the
records it consumed (``inputs``, the default), or with none, as a commit of
timer facts only does (``timers``). It prints ``FENCED`` or ``COMMITTED`` and
exits 0.
"""

from __future__ import annotations

import sys
import time

from processor.config.settings import Settings
from processor.errors import FencedError
from processor.transport.base import Outbound, TopicPartition
from processor.transport.factory import open_transport
from processor.transport.kafka import KafkaTransport

ZOMBIE_VALUE = b"written by the zombie"
_POLL_DEADLINE_S = 60.0


def main(group: str, input_topic: str, output_topic: str, commits: str = "inputs") -> int:
    transport = open_transport(Settings())
    assert isinstance(transport, KafkaTransport)
    session = transport.session(group, "zombie")
    assigned: list[TopicPartition] = []
    session.subscribe([input_topic], assigned.extend, lambda _: None)
    consumed: dict[TopicPartition, int] = {}
    deadline = time.monotonic() + _POLL_DEADLINE_S
    # "fresh": timer facts right after the assignment, before any input was polled.
    while not (assigned if commits == "fresh" else consumed):
        assert time.monotonic() < deadline, "no assignment or no input to consume"
        for record in session.poll(100, 0.1):
            consumed[record.position] = record.offset + 1
    assert commits != "fresh" or not consumed, "the group's input was all consumed before"
    session.begin()
    session.produce(Outbound(output_topic, b"zombie", ZOMBIE_VALUE, (), 0))
    print("READY", flush=True)
    sys.stdin.readline()  # frozen here until the test wakes us and asks to commit
    try:
        session.commit(consumed if commits == "inputs" else {})
        print("COMMITTED", flush=True)
    except FencedError as exc:
        print(f"FENCED {exc}", flush=True)
    session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
