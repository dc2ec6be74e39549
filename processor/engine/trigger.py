"""The trigger stage: turns records of users' own topics into runs, exactly once.

A consumer-group member of its own (group ``<group>.triggers``) reads every
topic that a pipeline declares a trigger on, with a transactional session of its
own (``ProcessorSession``: EOS v2 on Kafka, one SQLite transaction on the
embedded log). Each polled batch is one transaction:

1. map each record (``trigger_submit``, pure but for the user's function) to a
   SubmitRun on runs.commands (keyed by its run id) or to a rejection on
   admission.rejected (with the record's bytes and the reason),
2. commit those records together with the consumed offsets of the user topics.

A crash before 2 leaves nothing: the batch is read and mapped again. A crash after
it leaves the offsets past the batch. Either way each record is submitted once; the
run id derives from the record, so even a second submit would start no second run.

Decoders are looked up by name in the ``decoders`` mapping (``DECODERS``: "json"
and "bytes", and "avro", Confluent-framed Avro through the deployment's schema
registry, ``processor.transport.avro_decoder``); each entry is a factory that
takes the deployment's ``Settings`` and returns ``value -> decoded``. A decoder's
exception becomes a ``trigger_decode_failed`` rejection, so it needs no error
handling of its own, except that an unreachable registry raises ``TransportError``
(the stage then waits and retries the batch instead of rejecting valid records).
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from processor.config.settings import Settings
from processor.errors import ConfigurationError, FencedError, SessionLostError, TransportError
from processor.facts.codec import encode
from processor.facts.models import SubmitRun
from processor.facts.rejection import rejected
from processor.facts.topics import TopicName
from processor.transport.base import (
    Outbound,
    ProcessorSession,
    Record,
    TopicPartition,
    Transport,
)
from processor.transport.clock import Clock, wall_clock_ms
from processor.transport.partitioner import partition_for
from processor.transport.topology import Topology
from processor.worker.trigger import (
    BUILTIN_DECODERS,
    Decoder,
    DecoderFactory,
    Trigger,
    TriggerRecord,
    TriggerRefusal,
    trigger_submit,
)

__all__ = ["DECODERS", "BoundTrigger", "TriggerStage", "trigger_group"]

logger = logging.getLogger(__name__)

_MAX_PAUSE_S = 5.0

#: The decoders a deployment offers: the built-in ones and Avro through the registry.


def _avro_decoder(settings: Settings) -> Decoder:
    """The ``avro`` decoder; the registry client (and its HTTP stack) is imported only
    by a deployment that has a trigger using it, not by every processor start."""
    from processor.transport.avro_decoder import avro_decoder

    return avro_decoder(settings)


DECODERS: Mapping[str, DecoderFactory] = {**BUILTIN_DECODERS, "avro": _avro_decoder}


def trigger_group(settings: Settings) -> str:
    """The consumer group (and transactional-id stem) of the trigger stage.

    The transactional ids are ``<group>.triggers-<instance>`` and the loop's
    ``<group>-<instance>``: the character after the group differs, so no instance id
    makes the two collide (either would fence the other's producer).
    """
    return f"{settings.group}.triggers"


@dataclass(frozen=True, slots=True)
class BoundTrigger:
    """A declared trigger with its pipeline and its deployment's decoder."""

    pipeline: str
    trigger: Trigger
    decoder: Decoder


def bind_triggers(
    declared: Sequence[tuple[str, Trigger]],
    settings: Settings,
    decoders: Mapping[str, DecoderFactory],
) -> list[BoundTrigger]:
    """Resolve each trigger's decoder by name; refuse a name the deployment does not offer."""
    bound = []
    for pipeline, trigger in declared:
        factory = decoders.get(trigger.decoder)
        if factory is None:
            offered = ", ".join(sorted(decoders))
            raise ConfigurationError(
                f"pipeline {pipeline!r}: trigger on {trigger.topic!r} asks for decoder "
                f"{trigger.decoder!r}; this deployment offers {offered}"
            )
        bound.append(BoundTrigger(pipeline, trigger, factory(settings)))
    return bound


class TriggerStage:
    """Consumes the user topics of the declared triggers and submits one run per record."""

    def __init__(
        self,
        transport: Transport,
        topology: Topology,
        settings: Settings,
        declared: Sequence[tuple[str, Trigger]],
        *,
        instance_id: str,
        clock: Clock = wall_clock_ms,
        decoders: Mapping[str, DecoderFactory] = DECODERS,
    ) -> None:
        self._transport = transport
        self._topology = topology
        self._group = trigger_group(settings)
        self._instance_id = instance_id
        self._clock = clock
        self._max_batch = settings.max_batch
        self._poll_timeout_s = settings.poll_timeout_ms / 1000
        self._by_topic: dict[str, list[BoundTrigger]] = defaultdict(list)
        for bound in bind_triggers(declared, settings, decoders):
            self._by_topic[bound.trigger.topic].append(bound)
        self._session: ProcessorSession | None = None
        # Committed since the start: runs submitted, records rejected (tests, benchmarks).
        self.submitted = 0
        self.rejected = 0

    @property
    def topics(self) -> list[str]:
        return sorted(self._by_topic)

    def run(self, stop: threading.Event) -> None:
        """Submit runs until ``stop`` is set; wait out (and log) an unavailable log."""
        pause = 0.1
        try:
            while not stop.is_set():
                try:
                    self.run_once()
                    pause = 0.1
                except TransportError as exc:  # a missing topic too: it may be created later
                    logger.warning("triggers: %s; retrying in %.1fs", exc, pause)
                    self._drop_session()
                    stop.wait(pause)
                    pause = min(pause * 2, _MAX_PAUSE_S)
        finally:
            self.close()

    def run_once(self) -> int:
        """Poll one batch of user records, submit or reject each, commit; return the count."""
        session = self._session or self._join()
        records = session.poll(self._max_batch, self._poll_timeout_s)
        if not records:
            return 0
        now = self._clock()
        outbound: list[Outbound] = []
        consumed: dict[TopicPartition, int] = {}
        for record in records:
            consumed[record.position] = record.offset + 1
            outbound.extend(self._outbound(record, now))
        self._commit(session, outbound, consumed)
        return len(records)

    def close(self) -> None:
        self._drop_session()

    def _join(self) -> ProcessorSession:
        session = self._transport.session(self._group, self._instance_id)
        try:
            session.subscribe(self.topics, _ignore, _ignore)
        except BaseException:
            _close_quietly(session)
            raise
        self._session = session
        return session

    def _outbound(self, record: Record, now: int) -> list[Outbound]:
        """The SubmitRun (or rejection) of each trigger on the record's topic."""
        rec = TriggerRecord(
            record.topic,
            record.partition,
            record.offset,
            record.key,
            record.value,
            record.headers,
            record.timestamp_ms,
        )
        out = []
        for bound in self._by_topic.get(record.topic, ()):
            outcome = trigger_submit(bound.pipeline, bound.trigger, bound.decoder, rec, now)
            if isinstance(outcome, TriggerRefusal):
                out.append(self._rejection(record, outcome, now))
            else:
                out.append(self._submit(outcome))
        return out

    def _submit(self, command: SubmitRun) -> Outbound:
        key = command.run_id.encode()
        partition = partition_for(key, self._topology.partitions)
        topic = self._topology.name(TopicName.COMMANDS)
        return Outbound(topic, key, encode(command), (), partition)

    def _rejection(self, record: Record, refusal: TriggerRefusal, now: int) -> Outbound:
        logger.info(
            "trigger rejected %s@%d/%d: %s %s",
            record.topic,
            record.partition,
            record.offset,
            refusal.reason,
            refusal.detail,
        )
        value = encode(rejected(record, refusal.reason, refusal.detail, now))
        key = record.key or b""
        return Outbound(self._topology.name(TopicName.REJECTED), key, value)

    def _commit(
        self,
        session: ProcessorSession,
        outbound: list[Outbound],
        consumed: Mapping[TopicPartition, int],
    ) -> None:
        try:
            # 1. the submits and rejections inside one transaction
            session.begin()
            for record in outbound:
                session.produce(record)
            # 2. committed with the consumed offsets of the user topics
            session.commit(consumed)
        except (FencedError, SessionLostError) as exc:
            # Another member owns these partitions now (or our producer hung): the batch
            # is its to submit; a new session fences the stuck one before it reads.
            logger.warning("triggers: %s; rejoining, the batch will be read again", exc)
            self._drop_session()
            return
        except TransportError as exc:
            logger.warning("triggers: commit failed, the batch will be read again: %s", exc)
            self._abort(session)
            return
        commands = self._topology.name(TopicName.COMMANDS)
        submitted = sum(1 for record in outbound if record.topic == commands)
        self.submitted += submitted
        self.rejected += len(outbound) - submitted

    def _abort(self, session: ProcessorSession) -> None:
        try:
            session.abort()
        except TransportError:
            self._drop_session()

    def _drop_session(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            _close_quietly(session)


def _ignore(partitions: Sequence[TopicPartition]) -> None:
    """The stage keeps no per-partition state: an assignment needs no restore."""


def _close_quietly(session: ProcessorSession) -> None:
    try:
        session.close()
    except TransportError as exc:  # closing a broken session cannot make it worse
        logger.warning("triggers: closing the old session failed: %s", exc)
