"""The Quix Streams side of bench/quix_fold.py: a stateful per-run fold of runs.facts.

Runs in the Quix virtualenv (Quix Streams pins confluent-kafka < 2.13; see
bench/requirements-quix.txt), with the repository on PYTHONPATH so it can use the
processor's Avro codec and reducer:

    PYTHONPATH=. /tmp/quixvenv/bin/python bench/quix_fold_app.py --bootstrap 127.0.0.1:9092
        --topic P.runs.facts --expected N --state-dir DIR [--mode runstate|minimal]
        [--commit-every 10000] [--no-changelog]

A Quix ``Application`` with ``processing_guarantee="exactly-once"`` (transactional
producer, read_committed consumer, offsets and state changelog committed in one
transaction at each checkpoint), consumer group of its own, ``auto_offset_reset
="earliest"``, a checkpoint every ``--commit-every`` messages (and every 5 s, Quix's
default). Per record:

- the value deserializer decodes the fact with ``processor.facts.codec.decode_fact``
  (the processor's own decoding: Avro single-object + the pydantic model);
- ``sdf.update(fold, stateful=True)``: ``State`` is scoped to the message key (the run
  id). ``runstate``: ``state.get("run")`` (the RunState's JSON, as Quix state holds
  JSON-serializable values), ``RunState.model_validate_json``, ``processor.model.reduce``,
  ``state.set("run", new.model_dump_json(exclude_defaults=True))``: the processor's own projection,
  byte for byte what its ``runs`` column family holds. ``minimal``: a far lighter
  fold, ``state.get("run")`` of a two-field dict and ``state.set`` of its update
  (Quix's own per-record floor for any stateful fold over these facts).

Timing starts at the first record's fold and stops when ``--expected`` records were
folded (``last``) and after the final checkpoint and shutdown (``end``); CPU time of
the process (all threads) from the first record to the last. Prints one line of JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import uuid
from typing import Any

from quixstreams import Application, State
from quixstreams.models.serializers import Deserializer

from processor.facts.codec import decode_fact
from processor.model.reduce import reduce
from processor.model.state import RunState


class FactDeserializer(Deserializer):
    """A runs.facts value as the processor decodes it."""

    def __call__(self, value: bytes, ctx: Any) -> Any:
        return decode_fact(value)


class Progress:
    def __init__(self, app: Application, expected: int) -> None:
        self.app = app
        self.expected = expected
        self.count = 0
        self.first = self.last = 0.0
        self.first_cpu = self.last_cpu = 0.0

    def tick(self) -> None:
        if self.count == 0:
            self.first, self.first_cpu = time.perf_counter(), time.process_time()
        self.count += 1
        if self.count == self.expected:
            self.last, self.last_cpu = time.perf_counter(), time.process_time()
            self.app.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--expected", type=int, required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--mode", choices=("runstate", "minimal"), default="runstate")
    parser.add_argument("--commit-every", type=int, default=10_000)
    parser.add_argument("--no-changelog", action="store_true")
    parser.add_argument("--group", default=f"bench-quix-{uuid.uuid4().hex[:8]}")
    args = parser.parse_args()
    logging.getLogger("quixstreams").setLevel(logging.WARNING)

    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.group,
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        commit_every=args.commit_every,
        state_dir=args.state_dir,
        use_changelog_topics=not args.no_changelog,
        loglevel="WARNING",
    )
    progress = Progress(app, args.expected)
    topic = app.topic(args.topic, key_deserializer="str", value_deserializer=FactDeserializer())
    sdf = app.dataframe(topic)

    def fold_runstate(fact: Any, state: State) -> None:
        raw = state.get("run")
        current = None if raw is None else RunState.model_validate_json(raw)
        folded = reduce(current, fact)
        if folded is not None and folded is not current:
            state.set("run", folded.model_dump_json(exclude_defaults=True))
        progress.tick()

    def fold_minimal(fact: Any, state: State) -> None:
        current = state.get("run") or {"version": 0, "facts": 0}
        state.set("run", {"version": fact.seq, "facts": current["facts"] + 1})
        progress.tick()

    sdf.update(fold_runstate if args.mode == "runstate" else fold_minimal, stateful=True)
    started = time.perf_counter()
    app.run()
    end = time.perf_counter()
    seconds = progress.last - progress.first
    print(
        json.dumps(
            {
                "side": "quix",
                "mode": args.mode,
                "changelog": not args.no_changelog,
                "records": progress.count,
                "startup_s": round(progress.first - started, 3),
                "first_to_last_s": round(seconds, 3),
                "first_to_end_s": round(end - progress.first, 3),
                "records_per_s": progress.count / seconds if seconds else 0.0,
                "records_per_cpu_s": progress.count / (progress.last_cpu - progress.first_cpu),
                "records_per_s_to_end": progress.count / (end - progress.first),
            }
        )
    )


if __name__ == "__main__":
    main()
