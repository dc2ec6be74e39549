"""Generated bad records for every processor input topic (a helper module: no tests here).

``generate(topic, n, seed, world)`` yields ``n`` records for one input topic, the same
ones for the same seed: random bytes, empty values and tombstones, truncated and
bit-flipped valid records of the topic's own schemas, valid records of every other
schema, huge values, empty keys, keys of another partition, forged and replayed
tokens and signatures, hostile JSON. Each record says what must become of it
(``expect``):

- ``REFUSED``: in admission.rejected, with a reason and these exact bytes. The
  rejection names where it was decided: the partition it was produced to when it is
  refused as it is decoded (not Avro, wrong schema, forged token), or its run's
  partition when the processor first forwarded it there (a message about a run on a
  partition that is not its run's is forwarded, then decided: ``run_id`` names it).
  A bit-flipped record may name another run: its rejection may be on any partition.
- ``NOT_REFUSED``: legitimate, never in admission.rejected: an identical replay of an
  admitted completion is a no-op; a progress report of no current attempt is only
  counted (``engine/inputs.py``: ``counted``).
- ``ORACLE``: a trigger topic's record, refused or not as the pure trigger mapping
  (``trigger_submit``) says; the test asks it.

Every "valid" record is about runs that do not exist or are over, so none may change
a live run: a random run id, an unknown pipeline, a real token whose interaction
was admitted long ago.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from io import BytesIO
from typing import Any

import fastavro

from processor.facts import handoff_signature, json_wire, tokens
from processor.facts.codec import SINGLE_OBJECT_MAGIC, codec
from processor.facts.keyring import KeyRing
from processor.facts.models import (
    FACT_TYPES,
    MESSAGE_TYPES,
    AttemptProgress,
    BoundaryCompletion,
    CancelRun,
    CheckpointHandoff,
    RedriveRun,
    ReleaseRun,
    ResolveAttempt,
    SegmentResult,
    SignalEvent,
    SubmitRun,
    WorkerAnnouncement,
)
from processor.facts.payload import derive_run_id
from processor.facts.topics import TopicName
from processor.transport.partitioner import partition_for

__all__ = ["TRIGGER", "Expect", "Fuzzed", "World", "generate", "hostile_json"]

#: The trigger topic's name in ``generate`` (the test maps it to its user topic).
TRIGGER = "trigger"
#: Sizes of the huge values: all under Kafka's default 1 MB message, the largest close
#: to it (a rejection carries more: the key twice and a reason). A huge key and its
#: value take half of one each.
HUGE_SIZES = (64 * 1024, 300 * 1024, 900 * 1024)
JSON = "application/json"


class Expect(Enum):
    REFUSED = "refused"
    NOT_REFUSED = "not_refused"
    ORACLE = "oracle"


@dataclass(frozen=True, slots=True)
class Fuzzed:
    """One generated record: where it goes, its bytes, and what must become of it."""

    kind: str
    key: bytes
    value: bytes | None
    partition: int  # the partition it is produced to
    expect: Expect
    run_id: str | None = None  # the run it is about, when the processor may forward it
    headers: tuple[tuple[str, bytes], ...] = ()
    #: The partitions its rejection may name: where it was produced, or its run's.
    refused_on: frozenset[int] = frozenset()


@dataclass(frozen=True)
class World:
    """What the generator may use: the partition count, the deployment's key ring, and
    records of runs that are over (their completions and run ids)."""

    partitions: int
    keys: KeyRing
    finished_runs: Sequence[str] = ()
    admitted_completions: Sequence[tuple[str, bytes]] = field(default=())  # (run id, value)
    #: With a schema registry: (topic, single-object value) -> the Confluent framing.
    frame: Callable[[str, bytes], bytes] | None = None


# --- Avro values ------------------------------------------------------------------------------


def _random_string(rng: random.Random, max_len: int = 12) -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789-_:/. é\u2603\U0001f600"
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(max_len + 1)))


def _random_value(rng: random.Random, schema: Any, depth: int = 0) -> Any:
    """A random value of a parsed Avro schema."""
    if isinstance(schema, list):  # a union
        return _random_value(rng, rng.choice(schema), depth)
    if isinstance(schema, str):
        return _PRIMITIVES[schema](rng)
    kind = schema["type"]
    if kind in {"record", "error"}:
        return {f["name"]: _random_value(rng, f["type"], depth + 1) for f in schema["fields"]}
    if kind == "array":
        count = rng.randrange(3) if depth < 4 else 0
        return [_random_value(rng, schema["items"], depth + 1) for _ in range(count)]
    if kind == "map":
        count = rng.randrange(3) if depth < 4 else 0
        return {
            _random_string(rng): _random_value(rng, schema["values"], depth + 1)
            for _ in range(count)
        }
    if kind == "enum":
        return rng.choice(schema["symbols"])
    if kind == "fixed":
        return rng.randbytes(schema["size"])
    return _random_value(rng, kind, depth)


_PRIMITIVES: dict[str, Any] = {
    "null": lambda rng: None,
    "boolean": lambda rng: rng.random() < 0.5,
    "int": lambda rng: rng.randrange(-(2**31), 2**31),
    "long": lambda rng: rng.randrange(-(2**63), 2**63),
    "float": lambda rng: rng.random(),
    "double": lambda rng: rng.random(),
    "bytes": lambda rng: rng.randbytes(rng.randrange(16)),
    "string": _random_string,
}


def avro_record(model: type[Any], values: dict[str, Any]) -> bytes:
    """``values`` single-object encoded with ``model``'s schema (no model validation, so
    values a model would refuse are written too)."""
    schema = codec().schema_of(model)
    out = BytesIO()
    out.write(SINGLE_OBJECT_MAGIC + codec().fingerprint_of(model))
    fastavro.schemaless_writer(out, schema, values)
    return out.getvalue()


def random_record(rng: random.Random, model: type[Any], **fixed: Any) -> bytes:
    """A random record of ``model``'s schema, with the ``fixed`` fields."""
    values = _random_value(rng, codec().schema_of(model))
    values.update(fixed)
    return avro_record(model, values)


# --- hostile JSON -----------------------------------------------------------------------------


def hostile_json(rng: random.Random) -> bytes:
    """Bytes meant to hurt a JSON parser: deep nesting, huge numbers, NaN, lone
    surrogates, duplicate keys, a BOM, invalid UTF-8, truncation (some are valid JSON)."""
    depth = rng.choice((100, 1_000, 100_000))
    choices: list[bytes] = [
        b"[" * depth + b"]" * depth,
        b'{"a":' * depth + b"1" + b"}" * depth,
        b"[" * depth,
        b"9" * rng.choice((20, 5_000, 50_000)),
        b'{"n": ' + b"9" * 5_000 + b"}",
        b'{"n": 1e999}',
        b'{"n": -1e999}',
        b'{"n": NaN}',
        b'{"n": Infinity}',
        b'{"n": "\\ud800"}',
        b'{"n": 1, "n": 2}',
        b"\xef\xbb\xbf{}",
        b'{"n": "\xff\xfe"}',
        b'{"n": 1',
        b'{"n": true}',
        b'{"n": null}',
        b'{"n": [1]}',
        b'{"n": {"$ref": "#"}}',
        b'"' + b"x" * 10_000 + b'"',
        b"null",
        b"",
        b" ",
        b"\x00",
        json.dumps({"n": "1" * 100}).encode(),
        json.dumps({_random_string(rng): _random_string(rng)}).encode(),
    ]
    return rng.choice(choices)


# --- per topic ----------------------------------------------------------------------------------


def _run_id(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _other_key(rng: random.Random, partition: int, partitions: int) -> bytes:
    """A key whose partition is not ``partition`` (with one partition: any key)."""
    while True:
        key = f"other-{rng.getrandbits(32)}".encode()
        if partitions == 1 or partition_for(key, partitions) != partition:
            return key


@dataclass(frozen=True, slots=True)
class _Message:
    """A well-formed message of the topic, refused by the processor: as it decodes
    (``decided`` False) or by the decision on its run (True)."""

    value: bytes
    run_id: str | None
    decided: bool
    headers: tuple[tuple[str, bytes], ...] = ()
    flippable: bool = True  # False: a flipped bit may make it valid
    #: Bits are flipped only in this many last bytes (None: anywhere); an event's
    #: address must stay as it is: a flip could make a keyed event of one for a run.
    flip_tail: int | None = None


class _Topic:
    """The generator of one input topic (run-addressed topics; triggers below)."""

    carries: tuple[type[Any], ...] = ()

    def __init__(self, topic: str, rng: random.Random, world: World) -> None:
        self.topic = topic
        self.rng = rng
        self.world = world

    def message(self) -> _Message:
        raise NotImplementedError

    def other_schema(self) -> bytes:
        models = [m for m in (*FACT_TYPES, *MESSAGE_TYPES) if m not in self.carries]
        return random_record(self.rng, self.rng.choice(models))

    def huge_message(self, size: int) -> _Message:
        return self.message()


class _Commands(_Topic):
    carries = (SubmitRun, CancelRun, ResolveAttempt, RedriveRun, ReleaseRun)

    def message(self) -> _Message:
        rng = self.rng
        run_id = rng.choice([*self.world.finished_runs[:1], _run_id(rng), _run_id(rng)])
        kind = rng.randrange(7)
        if kind == 0:  # a run of a pipeline nobody defines
            return self._submit(rng, f"fz-{rng.getrandbits(32):x}", _input(rng))
        if kind == 1:  # a known pipeline, an input that is not JSON
            return self._submit(rng, "steps3", b"{not json" + rng.randbytes(4))
        if kind == 2:  # a known pipeline, a deadline no timer can hold
            deadline = rng.choice(
                [
                    {"deadline_ms": rng.choice((-1, -(2**63)))},
                    {"deadline_after_ms": rng.choice((2**63 - 1, -(2**63)))},
                ]
            )
            message = self._submit(
                rng, "steps3", b'{"n": 1}', submitted_ms=1_800_000_000_000, **deadline
            )
            return replace(message, flippable=False)  # deadline_ms -1 flips to 0: a run
        model = (CancelRun, ResolveAttempt, RedriveRun, ReleaseRun)[kind - 3]
        return _Message(random_record(rng, model, run_id=run_id), run_id, True)

    def _submit(
        self, rng: random.Random, pipeline: str, run_input: bytes, **fields: Any
    ) -> _Message:
        run_id = _run_id(rng)
        values: dict[str, Any] = {
            "run_id": run_id,
            "pipeline": pipeline,
            "input": run_input,
            "idempotency_key": None,
            "deadline_ms": None,
            "deadline_after_ms": None,
            "traceparent": None,
        }
        value = random_record(rng, SubmitRun, **(values | fields))
        return _Message(value, run_id, True)

    def huge_message(self, size: int) -> _Message:
        if self.rng.random() < 0.5:  # a huge name, quoted by the refusal's detail
            return self._submit(self.rng, "p" * size, _input(self.rng))
        run_input = json.dumps({"blob": "x" * size}).encode()
        return self._submit(self.rng, f"fz-{self.rng.getrandbits(32):x}", run_input)


class _Results(_Topic):
    # AttemptProgress and WorkerAnnouncement are not refused (a late report is counted,
    # an announcement is heard): the generator makes results only.
    carries = (SegmentResult,)

    def message(self) -> _Message:
        rng = self.rng
        run_id = rng.choice([*self.world.finished_runs, _run_id(rng)])
        value = random_record(rng, SegmentResult, run_id=run_id)
        return _Message(value, run_id, True)

    def huge_message(self, size: int) -> _Message:
        run_id = _run_id(self.rng)
        steps = [{"step": 0, "output": json.dumps({"blob": "x" * size}).encode()}]
        return _Message(
            random_record(self.rng, SegmentResult, run_id=run_id, steps=steps), run_id, True
        )

    def progress(self) -> tuple[bytes, str]:
        """A progress report or claim of a run that does not exist: counted, not refused."""
        run_id = _run_id(self.rng)
        return random_record(self.rng, AttemptProgress, run_id=run_id, details=None), run_id

    def other_schema(self) -> bytes:
        models = [
            m
            for m in (*FACT_TYPES, *MESSAGE_TYPES)
            if m not in (SegmentResult, AttemptProgress, WorkerAnnouncement)
        ]
        return random_record(self.rng, self.rng.choice(models))


class _Completions(_Topic):
    carries = (BoundaryCompletion,)

    def message(self) -> _Message:
        rng = self.rng
        kind = rng.randrange(6)
        if kind == 0 and self.world.admitted_completions:  # a replay with another payload
            run_id, value = rng.choice(self.world.admitted_completions)
            done = codec().decode_as(value, BoundaryCompletion)
            changed = done.model_copy(update={"payload": _input(rng), "idempotency_key": "fz"})
            return _Message(codec().encode(changed), run_id, True)
        if kind <= 1:  # a genuine token of an interaction that does not exist
            claims = tokens.TokenClaims(_run_id(rng), rng.randrange(5), f"i{rng.randrange(9)}", 1)
            return _Message(
                self._completion(tokens.sign(self.world.keys, claims)), claims.run_id, True
            )
        if kind == 2:  # JSON-shaped completion: hostile JSON
            return _Message(hostile_json(rng), None, False, json_wire.completion_headers())
        if kind == 3:  # JSON-shaped completion with a forged token
            doc = json.dumps({"token": self._forged(), "outcome": "success", "payload": 1})
            return _Message(doc.encode(), None, False, json_wire.completion_headers())
        return _Message(self._completion(self._forged()), None, False)

    def _completion(self, token: str, payload: bytes | None = None) -> bytes:
        rng = self.rng
        return random_record(
            rng,
            BoundaryCompletion,
            token=token,
            payload=_input(rng) if payload is None else payload,
            content_type=JSON,
        )

    def _forged(self) -> str:
        """A resume token that no key of the deployment signed (some name a real run)."""
        rng = self.rng
        run_id = rng.choice([*self.world.finished_runs, _run_id(rng)])
        real = tokens.sign(self.world.keys, tokens.TokenClaims(run_id, 1, "i0", 1))
        body, _, mac = real.rpartition(".")
        kid = self.world.keys.signing[0]
        forged = [
            _random_string(rng, 60),
            f"{body}.{mac[:-1]}{'A' if mac[-1] != 'A' else 'B'}",  # an altered MAC
            real.replace(f"v2.{kid}.", "v2.nokey.", 1),  # a key nobody configured
            tokens.sign(
                KeyRing.single(rng.randbytes(32), kid), tokens.TokenClaims(run_id, 1, "i0", 1)
            ),
            "v1." + ".".join(body.split(".")[2:]) + "." + mac,  # a v1 token with a v2 MAC
            "v2." + "." * rng.randrange(1, 9),
            "x" * rng.choice((1, 1_000, 100_000)),
        ]
        return rng.choice(forged)

    def huge_message(self, size: int) -> _Message:
        claims = tokens.TokenClaims(_run_id(self.rng), 1, "i0", 1)
        blob = json.dumps({"blob": "x" * size}).encode()
        token = tokens.sign(self.world.keys, claims)
        return _Message(self._completion(token, blob), claims.run_id, True)


class _Checkpoints(_Topic):
    carries = (CheckpointHandoff,)

    def message(self) -> _Message:
        rng = self.rng
        kind = rng.randrange(6)
        run_id = _run_id(rng)
        if kind == 0:  # genuine, to a run that does not exist
            return _Message(self._handoff(f"run:{run_id}"), run_id, True)
        if kind == 1:  # genuine, starts a pipeline nobody defines
            key = f"fz-{rng.getrandbits(64):x}"
            target = f"pipeline:fz-{rng.getrandbits(32):x}"
            return _Message(self._handoff(target, key), derive_run_id(key), True)
        if kind == 2:  # genuine, a target that is none
            return _Message(self._handoff(_random_string(rng)), None, False)
        if kind == 3:  # genuine, a payload that is not JSON
            return _Message(
                self._handoff(f"run:{run_id}", payload=hostile_json(rng) + b"{"), None, False
            )
        if kind == 4:  # unsigned
            return _Message(self._handoff(f"run:{run_id}", signature=None), None, False)
        return _Message(self._handoff(f"run:{run_id}", signature=self._forged()), None, False)

    def _handoff(
        self,
        target: str,
        key: str | None = None,
        payload: bytes | None = None,
        signature: str | bool | None = True,
    ) -> bytes:
        rng = self.rng
        handoff = CheckpointHandoff(
            source_run_id=_run_id(rng),
            checkpoint=_random_string(rng) or "cp",
            target=target,
            idempotency_key=key or f"fz-{rng.getrandbits(64):x}",
            payload=_input(rng) if payload is None else payload,
            content_type=JSON,
            signature=None,
        )
        if signature is True:
            handoff = handoff_signature.signed(self.world.keys, handoff)
        elif isinstance(signature, str):
            handoff = handoff.model_copy(update={"signature": signature})
        return codec().encode(handoff)

    def _forged(self) -> str:
        rng = self.rng
        kid = self.world.keys.signing[0]
        return rng.choice(
            [
                _random_string(rng, 40),
                f"v1.{kid}.{'A' * 43}",
                f"v1.nokey.{'A' * 43}",
                f"v2.{kid}.{'A' * 43}",
                "v1..",
            ]
        )

    def huge_message(self, size: int) -> _Message:
        run_id = _run_id(self.rng)
        blob = json.dumps({"blob": "x" * size}).encode()
        return _Message(self._handoff(f"run:{run_id}", payload=blob), run_id, True)


class _Events(_Topic):
    """Events addressed to one run, each refused: the run does not exist or is over, or
    the event is malformed. (Never by key: on its way through the partitions a keyed
    event is refused where the last of them is owned, not where it was produced.)"""

    carries = (SignalEvent,)

    def message(self) -> _Message:
        rng = self.rng
        kind = rng.randrange(7)
        run_id = _run_id(rng)
        if kind == 5:  # JSON-shaped event: hostile JSON
            return _Message(hostile_json(rng), None, False, json_wire.event_headers(), False)
        if kind == 6:  # JSON-shaped event to a run that does not exist
            doc = {"event_id": f"fz-{rng.getrandbits(64):x}", "name": "paid", "run_id": run_id}
            value = json.dumps(doc).encode()
            return _Message(value, run_id, True, json_wire.event_headers(), False)
        if kind == 0:  # to a run that does not exist
            return self._event(run_id=run_id)
        if kind == 1 and self.world.finished_runs:  # to a run that is over
            return self._event(run_id=rng.choice(self.world.finished_runs))
        if kind == 2:  # no address
            return self._event(run_id=None, decided=False)
        if kind == 3:  # both addresses
            return self._event(run_id=run_id, key=_random_string(rng), decided=False)
        if kind == 4:  # a payload that is not JSON
            return self._event(run_id=run_id, payload=hostile_json(rng) + b"{", decided=False)
        return self._event(run_id=run_id, event_id="", decided=False)  # no event id

    def _event(
        self,
        *,
        run_id: str | None,
        key: str | None = None,
        payload: bytes | None = None,
        event_id: str | None = None,
        decided: bool = True,
    ) -> _Message:
        rng = self.rng
        event = SignalEvent(
            event_id=f"fz-{rng.getrandbits(64):x}" if event_id is None else event_id,
            name=_random_string(rng) or "paid",
            run_id=run_id,
            correlation_key=key,
            correlation={_random_string(rng) or "k": _random_string(rng)},
            payload=_input(rng) if payload is None else payload,
        )
        value = codec().encode(event)
        return _Message(value, run_id, decided, flip_tail=len(value) - _address_end(event))

    def huge_message(self, size: int) -> _Message:
        blob = json.dumps({"blob": "x" * size}).encode()
        return self._event(run_id=_run_id(self.rng), payload=blob)


def _address_end(event: SignalEvent) -> int:
    """Where ``event``'s encoding leaves its address (run_id, correlation_key) behind."""
    bare = event.model_copy(
        update={"correlation": {}, "payload": b"", "content_type": "", "sent_ms": 0}
    )
    # The fields after the address, empty: a map's end, an empty bytes and string, a
    # null, a false, a zero, an empty array and a zero: one byte each.
    return len(codec().encode(bare)) - 8


_TOPICS: dict[str, type[_Topic]] = {
    TopicName.COMMANDS.value: _Commands,
    TopicName.RESULTS.value: _Results,
    TopicName.COMPLETIONS.value: _Completions,
    TopicName.CHECKPOINTS.value: _Checkpoints,
    TopicName.EVENTS.value: _Events,
}


def _input(rng: random.Random) -> bytes:
    return json.dumps({"n": rng.randrange(100), "s": _random_string(rng)}).encode()


# --- the generator --------------------------------------------------------------------------

#: (kind, weight) of the generated records of a run-addressed topic.
KINDS = (
    ("random_bytes", 10),
    ("magic_garbage", 5),
    ("header_garbage", 5),
    ("empty", 2),
    ("tombstone", 2),
    ("truncated", 12),
    ("bit_flip", 20),
    ("wrong_schema", 10),
    ("huge", 1),
    ("huge_key", 1),
    ("message", 13),
    ("empty_key", 8),
    ("other_partition", 12),
    ("exact_replay", 2),  # completions only (others make a message instead)
    ("progress", 2),  # results only (likewise)
)


def generate(topic: str, n: int, seed: int, world: World) -> Iterator[Fuzzed]:
    """``n`` generated records for ``topic`` (a ``TopicName`` value, or ``TRIGGER``)."""
    rng = random.Random(f"{seed}/{topic}")
    if topic == TRIGGER:
        yield from _trigger_records(rng, n, world)
        return
    source = _TOPICS[topic](topic, rng, world)
    kinds, weights = zip(*KINDS, strict=True)
    for _ in range(n):
        kind = rng.choices(kinds, weights)[0]
        if kind == "exact_replay" and not (
            isinstance(source, _Completions) and world.admitted_completions
        ):
            kind = "message"
        if kind == "progress" and not isinstance(source, _Results):
            kind = "message"
        yield _one(source, kind, world)


def _one(source: _Topic, kind: str, world: World) -> Fuzzed:
    rng, partitions = source.rng, world.partitions
    key = f"fz-{rng.getrandbits(32)}".encode()
    here = partition_for(key, partitions)
    if kind == "progress" and isinstance(source, _Results):  # counted in a metric
        value, run_id = source.progress()
        key = run_id.encode()
        return Fuzzed(kind, key, value, partition_for(key, partitions), Expect.NOT_REFUSED, run_id)
    if kind == "exact_replay" and world.admitted_completions:
        run_id, value = rng.choice(world.admitted_completions)  # an identical duplicate: a no-op
        key = run_id.encode()
        return Fuzzed(kind, key, value, partition_for(key, partitions), Expect.NOT_REFUSED, run_id)
    if kind in ("message", "empty_key", "other_partition", "bit_flip", "truncated", "huge"):
        size = rng.choice(HUGE_SIZES)
        message = source.huge_message(size) if kind == "huge" else source.message()
        while kind == "bit_flip" and not message.flippable:
            message = source.message()
        value = _framed(source, message.value)
        if kind == "truncated":
            value = value[: rng.randrange(len(value))] if value else value
        elif kind == "bit_flip":
            value = _flip(rng, value, message.flip_tail)
        elif message.run_id is not None:
            right = partition_for(message.run_id.encode(), partitions)
            key = {
                "message": message.run_id.encode(),
                "huge": message.run_id.encode(),
                "empty_key": b"",
                "other_partition": _other_key(rng, right, partitions),
            }[kind]
            here = partition_for(key, partitions)
        on = {here}
        run_id = message.run_id if kind not in ("truncated", "bit_flip") else None
        if kind == "bit_flip":  # a flip may change the run it names: any partition
            on = set(range(partitions))
        elif run_id is not None:  # decided on its run's partition
            right = partition_for(run_id.encode(), partitions)
            on = {right} if message.decided else {here, right}
        return Fuzzed(
            kind, key, value, here, Expect.REFUSED, run_id, message.headers, frozenset(on)
        )
    if kind == "huge_key":  # a rejection carries the key twice
        key = rng.randbytes(rng.choice(HUGE_SIZES) // 2)
        here = partition_for(key, partitions)
        value = rng.randbytes(rng.choice(HUGE_SIZES) // 2)
        return Fuzzed(kind, key, value, here, Expect.REFUSED, refused_on=frozenset({here}))
    value = _garbage(source, kind)
    if kind == "wrong_schema" and value is not None:
        value = _framed(source, value)
    elif kind == "header_garbage" and world.frame is not None and rng.random() < 0.5:
        value = (
            b"\x00" + rng.randrange(1, 200).to_bytes(4, "big") + rng.randbytes(rng.randrange(40))
        )
    return Fuzzed(kind, key, value, here, Expect.REFUSED, refused_on=frozenset({here}))


def _framed(source: _Topic, value: bytes) -> bytes:
    """Half the records of our schemas in the Confluent framing, when a registry is used."""
    frame = source.world.frame
    if frame is None or source.rng.random() < 0.5:
        return value
    return frame(source.topic, value)


def _garbage(source: _Topic, kind: str) -> bytes | None:
    rng = source.rng
    if kind == "random_bytes":
        return rng.randbytes(rng.choice((1, 2, 9, 10, 11, 50, 300)))
    if kind == "magic_garbage":  # the single-object magic, a fingerprint nobody has
        return SINGLE_OBJECT_MAGIC + rng.randbytes(8) + rng.randbytes(rng.randrange(40))
    if kind == "header_garbage":  # a schema the topic carries, a random body
        model = rng.choice(source.carries)
        return (
            SINGLE_OBJECT_MAGIC + codec().fingerprint_of(model) + rng.randbytes(rng.randrange(60))
        )
    if kind == "empty":
        return b""
    if kind == "tombstone":
        return None
    assert kind == "wrong_schema", kind
    return source.other_schema()


def _flip(rng: random.Random, value: bytes, tail: int | None = None) -> bytes:
    flipped = bytearray(value or b"\x00")
    first = 0 if tail is None else max(len(flipped) - tail, 0)
    for _ in range(rng.randrange(1, 4)):
        flipped[rng.randrange(first, len(flipped))] ^= 1 << rng.randrange(8)
    return bytes(flipped)


def _trigger_records(rng: random.Random, n: int, world: World) -> Iterator[Fuzzed]:
    """Records of a user topic read by a ``json`` trigger whose input is ``{"n": int(n)}``:
    mostly bad (the trigger mapping says which), some valid orders."""
    for _ in range(n):
        kind = rng.choices(
            ("random_bytes", "hostile_json", "no_n", "avro", "empty", "tombstone", "huge", "order"),
            (20, 30, 10, 10, 3, 3, 1, 3),
        )[0]
        key = rng.choice((b"", f"customer-{rng.randrange(50)}".encode()))
        value: bytes | None = {
            "random_bytes": lambda: rng.randbytes(rng.choice((1, 2, 9, 50, 300))),
            "hostile_json": lambda: hostile_json(rng),
            "no_n": lambda: json.dumps({"m": rng.randrange(9)}).encode(),
            "avro": lambda: random_record(rng, rng.choice((*FACT_TYPES, *MESSAGE_TYPES))),
            "empty": lambda: b"",
            "tombstone": lambda: None,
            "huge": lambda: b'{"n": 1, "pad": "' + b"x" * rng.choice(HUGE_SIZES) + b'"}',
            "order": lambda: json.dumps({"n": rng.randrange(1000)}).encode(),
        }[kind]()
        here = partition_for(key, world.partitions)
        yield Fuzzed(kind, key, value, here, Expect.ORACLE, refused_on=frozenset({here}))
