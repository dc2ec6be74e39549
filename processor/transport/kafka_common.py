"""Shared pieces of the Kafka transport: client configs, record conversion, error translation.

This is the one place where confluent-kafka's exceptions become ``TransportError``
or ``FencedError``: every Kafka client module funnels library errors through
``translate`` (or ``error_of``) so the rest of the engine never sees a
``KafkaException`` or a ``BufferError``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Message
from confluent_kafka import TopicPartition as KafkaTopicPartition

from processor.errors import FencedError, TransportError
from processor.transport.base import Headers, Record, TopicPartition

__all__ = [
    "FENCED_CODES",
    "GROUP_FENCED_CODES",
    "LIBRDKAFKA_LOGGER",
    "RECORD_SETTERS",
    "DeliveryCallback",
    "ErrorReporter",
    "RepeatFilter",
    "is_fatal",
    "is_fenced",
    "kafka_error",
    "kafka_offsets",
    "outbound_headers",
    "partitions_of",
    "records_of",
    "require_topics",
    "retrying",
    "to_record",
    "translate",
    "wait_for_first",
]

logger = logging.getLogger(__name__)


class RepeatFilter(logging.Filter):
    """Lets a line through once per ``window_s`` per shape; counts the repeats it drops.

    The shape is the message with its digits blanked: during a broker outage every
    client reconnects to every broker every few hundred milliseconds and librdkafka
    logs each failure ("Connect to ipv4#127.0.0.1:9092 failed ... (after 0ms ...)"),
    hundreds of lines a minute that say one thing. The next line of a shape after
    the window says how many were dropped.
    """

    _MAX_SHAPES = 1_000

    def __init__(self, window_s: float = 30.0, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self._window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._shapes: dict[str, tuple[float, int]] = {}  # shape -> (last let through, dropped)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        shape = _DIGITS.sub("#", message)
        now = self._clock()
        with self._lock:
            last, dropped = self._shapes.get(shape, (-math.inf, 0))
            if now - last < self._window_s:
                self._shapes[shape] = (last, dropped + 1)
                return False
            if len(self._shapes) >= self._MAX_SHAPES:
                self._shapes.clear()
            self._shapes[shape] = (now, 0)
        if dropped:
            record.msg = f"{message} ({dropped} similar lines dropped in {self._window_s:.0f}s)"
            record.args = ()
        return True


_DIGITS = re.compile(r"\d+")

#: librdkafka's own log lines (reconnect failures, transaction retries) go here, each
#: shape at most once per 30 s.
LIBRDKAFKA_LOGGER = logging.getLogger("processor.transport.librdkafka")
LIBRDKAFKA_LOGGER.addFilter(RepeatFilter())

#: Another producer with our transactional.id took over (``_FENCED`` is librdkafka's
#: local fatal code, the two others are what the broker answers).
FENCED_CODES = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)
#: The consumer-group generation moved on (a rebalance gave our partitions away) or
#: another member took our static identity: offsets of this generation must not commit.
GROUP_FENCED_CODES = frozenset(
    {KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID, KafkaError.FENCED_INSTANCE_ID}
)
#: Connectivity problems that librdkafka recovers from by itself.
_OUTAGE_CODES = frozenset(
    {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE}
)

T = TypeVar("T")

_METADATA_TIMEOUT_S = 10.0

#: ``on_delivery`` of ``Producer.produce``: (error or None, message).
DeliveryCallback = Callable[[KafkaError | None, Message], None]


def kafka_error(exc: KafkaException) -> KafkaError | None:
    """The ``KafkaError`` a ``KafkaException`` carries, if any."""
    arg = exc.args[0] if exc.args else None
    return arg if isinstance(arg, KafkaError) else None


def is_fatal(err: KafkaError) -> bool:
    """True when the client that reported ``err`` is unusable for good.

    librdkafka reports a fatal error to ``error_cb`` and to a consumer's commit and
    message callbacks as ``_FATAL``, whose ``fatal()`` flag is not always set (a static
    member fenced by its twin is one such case).
    """
    return bool(err.fatal()) or err.code() == KafkaError._FATAL


def is_fenced(err: KafkaError | None) -> bool:
    """True when ``err`` means this instance must stop: fatal, or fenced by another one."""
    if err is None:
        return False
    return is_fatal(err) or err.code() in FENCED_CODES or err.code() in GROUP_FENCED_CODES


def translate(what: str, exc: BaseException) -> TransportError:
    """The processor error for a library exception raised while doing ``what``."""
    if isinstance(exc, KafkaException):
        err = kafka_error(exc)
        if is_fenced(err):
            return FencedError(f"{what}: fenced ({err})")
        return TransportError(f"{what}: {err if err is not None else exc}")
    if isinstance(exc, BufferError):
        return TransportError(f"{what}: local queue full ({exc})")
    return TransportError(f"{what}: {exc}")


def require_topics(client: Consumer, names: Sequence[str], owner: str) -> None:
    """Refuse unknown topics up front: subscribing to one, Kafka would only log it, forever."""
    try:
        metadata = client.list_topics(timeout=_METADATA_TIMEOUT_S)
    except KafkaException as exc:
        raise translate(f"{owner}: list topics", exc) from exc
    missing = [name for name in names if name not in metadata.topics]
    if missing:
        raise TransportError(f"{owner}: unknown topics {', '.join(missing)}")


def retrying(what: str, call: Callable[[], T], deadline_s: float) -> T:
    """Run ``call``, retrying it while librdkafka says the error is retriable."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return call()
        except KafkaException as exc:
            err = kafka_error(exc)
            if err is None or not err.retriable() or time.monotonic() >= deadline:
                raise
            logger.info("%s: retrying after retriable error %s", what, err)


def kafka_offsets(consumed: Mapping[TopicPartition, int]) -> list[KafkaTopicPartition]:
    """``consumed`` (next offset to read per partition) as confluent-kafka partitions."""
    return [KafkaTopicPartition(tp.topic, tp.partition, offset) for tp, offset in consumed.items()]


def outbound_headers(headers: Headers) -> list[tuple[str, str | bytes | None]] | None:
    """Headers in the shape ``Producer.produce`` takes (None when there are none)."""
    return list(headers) if headers else None


#: The slot descriptors of ``Record``'s fields. ``Record`` is a frozen dataclass whose
#: generated ``__init__`` (one ``object.__setattr__`` lookup and call per field) costs
#: more than everything else done per consumed record; ``to_record`` and the reader's
#: loop build the same instances by filling the slots through these descriptors.
RECORD_SETTERS: dict[str, Any] = {
    field.name: Record.__dict__[field.name].__set__ for field in dataclasses.fields(Record)
}
if set(RECORD_SETTERS) != {
    "topic",
    "partition",
    "offset",
    "key",
    "value",
    "headers",
    "timestamp_ms",
}:  # a new Record field must be filled here too
    raise ImportError(f"cannot build Record with fields {sorted(RECORD_SETTERS)}")

_SET_TOPIC, _SET_PARTITION, _SET_OFFSET, _SET_KEY, _SET_VALUE, _SET_HEADERS, _SET_TIMESTAMP = (
    RECORD_SETTERS[name]
    for name in ("topic", "partition", "offset", "key", "value", "headers", "timestamp_ms")
)


def to_record(msg: Message) -> Record:
    """A ``Record`` from a consumed message without error (equal to one built by ``Record()``)."""
    headers = msg.headers()
    timestamp = msg.timestamp()[1]
    record: Record = object.__new__(Record)
    _SET_TOPIC(record, msg.topic())
    _SET_PARTITION(record, msg.partition())
    _SET_OFFSET(record, msg.offset())
    _SET_KEY(record, msg.key())
    _SET_VALUE(record, msg.value())
    _SET_HEADERS(record, tuple(headers) if headers else ())
    _SET_TIMESTAMP(record, timestamp if timestamp > 0 else 0)
    return record


def wait_for_first(
    consume: Callable[[int, float], list[Message]],
    poll: Callable[[float], Message | None],
    max_records: int,
    timeout_s: float,
) -> list[Message]:
    """Return what is queued at once, or wait up to ``timeout_s`` for the first message.

    ``Consumer.consume(n, timeout)`` only returns early once it has ``n`` messages:
    with fewer available it blocks for the whole timeout even after an EOF event.
    Draining with a zero timeout and blocking in ``poll`` (which returns on the
    first message or event) gives "whatever is there, as soon as there is some".
    """
    messages = consume(max_records, 0)
    if messages:
        return messages
    first = poll(timeout_s)
    if first is None:
        return []
    if max_records == 1:
        return [first]
    return [first, *consume(max_records - 1, 0)]


class ErrorReporter:
    """librdkafka's ``error_cb``: logs connectivity trouble once per outage, keeps fatal errors.

    librdkafka reconnects by itself, so an unreachable broker is not an exception
    for the caller; it is logged at warning level once when the outage starts and
    at info level when traffic flows again (``recovered``).
    """

    def __init__(self, client: str) -> None:
        self._client = client
        self._outage = False
        self._lock = threading.Lock()
        self._seen: set[int] = set()
        self.fatal: KafkaError | None = None

    def __call__(self, err: KafkaError) -> None:
        if is_fatal(err):
            self.fatal = err
            logger.error("%s: fatal Kafka error %s", self._client, err)
        elif err.code() in _OUTAGE_CODES:
            with self._lock:
                first, self._outage = not self._outage, True
            if first:
                logger.warning("%s: Kafka unreachable, reconnecting: %s", self._client, err)
            else:
                logger.debug("%s: still unreachable: %s", self._client, err)
        elif err.code() not in self._seen:
            self._seen.add(err.code())
            logger.warning("%s: Kafka error %s", self._client, err)
        else:
            logger.debug("%s: Kafka error %s", self._client, err)

    def recovered(self) -> None:
        """Note that the client talks to Kafka again (ends an outage)."""
        if self._outage:
            with self._lock:
                was, self._outage = self._outage, False
            if was:
                logger.info("%s: Kafka reachable again", self._client)

    def config(self) -> dict[str, Any]:
        """The librdkafka config entries that route errors and logs to this reporter."""
        return {"error_cb": self, "logger": LIBRDKAFKA_LOGGER}


def partitions_of(kafka_partitions: Iterable[KafkaTopicPartition]) -> list[TopicPartition]:
    """confluent-kafka partitions as our ``TopicPartition`` values."""
    return [TopicPartition(tp.topic, tp.partition) for tp in kafka_partitions]


def records_of(messages: list[Message], client: str, reporter: ErrorReporter) -> list[Record]:
    """The records among consumed ``messages``; error events are logged or raised.

    A partition EOF is not an error. A fatal error raises (``FencedError``: the
    client is unusable and must be replaced); anything else is logged and skipped,
    since librdkafka retries by itself.
    """
    records: list[Record] = []
    for msg in messages:
        err = msg.error()
        if err is None:
            records.append(to_record(msg))
        elif err.code() == KafkaError._PARTITION_EOF:
            continue
        elif is_fatal(err):
            raise FencedError(f"{client}: consumer failed fatally ({err})")
        else:
            reporter(err)
    if records:
        reporter.recovered()
    return records
