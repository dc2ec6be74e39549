"""The demo's external payment system as its own process, for the Kafka benchmarks.

Run: ``PYTHONPATH=. PROCESSOR_RESUME_SECRET=... python bench/kafka_responder.py
--broker kafka://127.0.0.1:9092 --topic-prefix P. [--group G]``; with ``--broker
embedded --data-dir D``, on the embedded log under D instead (bench/closed_loop.py).

A ``processor.clients.external.Responder`` (what ``processor demo`` runs on a thread)
consuming ``boundary.requests`` and answering target ``payments`` with
``processor.examples.demo.payments_simulator`` through ``boundary.completions``,
until SIGTERM/SIGINT. It sends no duplicate or forged completions.
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from processor.clients.external import Responder
from processor.config.settings import Settings
from processor.examples.demo import payments_simulator
from processor.transport.deployment import Deployment


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", required=True, help="kafka://host:port, or embedded")
    parser.add_argument("--data-dir", help="where the embedded log is (with --broker embedded)")
    parser.add_argument("--topic-prefix", default="")
    parser.add_argument("--group", default="processor-responders")
    args = parser.parse_args()
    where = {"data_dir": Path(args.data_dir)} if args.data_dir else {}
    settings = Settings(broker=args.broker, topic_prefix=args.topic_prefix, **where)
    deployment = Deployment.from_settings(settings)
    responder = Responder(
        deployment.transport,
        deployment.topology,
        {"payments": payments_simulator},
        group=args.group,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    responder.run(stop)


if __name__ == "__main__":
    main()
