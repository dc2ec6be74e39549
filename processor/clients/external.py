"""For external systems: answer boundary requests with completions.

``CompletionClient.complete(token, payload)`` / ``fail(token, error)`` produce a
BoundaryCompletion keyed by the run id the token names, so it reaches the
partition that owns the run. ``Responder`` consumes boundary.requests for one
or more targets and answers with a handler (the demo's payment simulator). A
cancel notice (``BoundaryRequest.cancel`` set: the run was stopped while the
interaction was open) is never answered: it goes to ``on_cancel``, if given, so the
simulated system can stop its work too.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from processor.clients.completion_receipt import CompletionReceipt
from processor.errors import FencedError, ProcessorError, TransportError
from processor.facts import json_wire, payload, tokens
from processor.facts.codec import codec, encode
from processor.facts.json_wire import Wire
from processor.facts.models import BoundaryCompletion, BoundaryRequest
from processor.facts.topics import TopicName
from processor.transport.base import Headers, Outbound, Producer, Transport
from processor.transport.membership import join_until_stopped
from processor.transport.topology import Topology

__all__ = ["CompletionClient", "Handler", "OnCancel", "Responder"]

logger = logging.getLogger(__name__)

Handler = Callable[[BoundaryRequest, Any], Any]
AfterAnswer = Callable[[BoundaryRequest, BoundaryCompletion, "CompletionClient"], None]
OnCancel = Callable[[BoundaryRequest], None]


class CompletionClient:
    """Produces completions for resume tokens."""

    def __init__(
        self, transport: Transport, topology: Topology, *, max_payload_bytes: int | None = None
    ) -> None:
        """``max_payload_bytes``: a payload over it raises ``PayloadTooLarge`` before
        anything is produced (the processor refuses it too: ``payload_too_large``)."""
        self._topic = topology.name(TopicName.COMPLETIONS)
        self._max_payload_bytes = max_payload_bytes
        self._transport = transport
        self._producer: Producer | None = None

    def complete(self, token: str, value: Any, idempotency_key: str | None = None) -> None:
        self.send(token, "success", payload.dumps(value), None, idempotency_key)

    def fail(self, token: str, error: str, idempotency_key: str | None = None) -> None:
        self.send(token, "failure", b"", error, idempotency_key)

    def send(
        self,
        token: str,
        outcome: str,
        body: bytes,
        error: str | None,
        idempotency_key: str | None = None,
        *,
        flush: bool = True,
        wire: Wire = "avro",
    ) -> BoundaryCompletion:
        """Produce a completion for ``token``, in Avro or in the JSON shape (``wire``)."""
        claims, completion = self._completion(token, outcome, body, error, idempotency_key)
        self.produce_raw(claims.run_id, *_encoded(completion, wire))
        if flush:
            self.flush()
        return completion

    def deliver(
        self,
        token: str,
        outcome: str,
        body: bytes,
        error: str | None,
        idempotency_key: str | None = None,
        *,
        wire: Wire = "avro",
    ) -> CompletionReceipt:
        """``send``, waiting until the completion is durable: the receipt says where it
        was written (and that it is queued: the processor decides on it)."""
        claims, completion = self._completion(token, outcome, body, error, idempotency_key)
        value, headers = _encoded(completion, wire)
        record = Outbound(self._topic, claims.run_id.encode(), value, headers)
        tp, offset = self._open_producer().deliver(record)
        return CompletionReceipt(
            run_id=claims.run_id,
            interaction=claims.interaction,
            outcome=completion.outcome,
            idempotency_key=completion.idempotency_key,
            partition=tp.partition,
            offset=offset,
        )

    def _completion(
        self, token: str, outcome: str, body: bytes, error: str | None, idempotency_key: str | None
    ) -> tuple[tokens.TokenClaims, BoundaryCompletion]:
        """The completion to produce, after the checks a sender can make itself."""
        claims = tokens.parse(token)
        if claims is None:
            raise ProcessorError("not a resume token")
        payload.check_size(body, self._max_payload_bytes, "completion payload")
        completion = BoundaryCompletion(
            token=token,
            idempotency_key=idempotency_key or _default_key(token, outcome, body, error),
            outcome="success" if outcome == "success" else "failure",
            payload=body,
            error=error,
        )
        return claims, completion

    def produce_raw(self, run_id: str, value: bytes, headers: Headers = ()) -> None:
        """Produce any bytes as a completion for ``run_id`` (tests feed garbage this way)."""
        self._open_producer().produce(Outbound(self._topic, run_id.encode(), value, headers))

    def _open_producer(self) -> Producer:
        if self._producer is None:
            self._producer = self._transport.producer()
        return self._producer

    def flush(self) -> None:
        if self._producer is not None:
            self._producer.flush()

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
            self._producer = None


def _encoded(completion: BoundaryCompletion, wire: Wire) -> tuple[bytes, Headers]:
    """The record value (and headers) of ``completion`` in the ``wire`` shape."""
    if wire == "json":
        return json_wire.completion_document(completion), json_wire.completion_headers()
    return encode(completion), ()


def _default_key(token: str, outcome: str, body: bytes, error: str | None) -> str:
    digest = hashlib.sha256()
    for part in (token.encode(), outcome.encode(), body, (error or "").encode()):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()[:32]


class Responder:
    """An external-system simulator: answers requests for its targets with handlers."""

    def __init__(
        self,
        transport: Transport,
        topology: Topology,
        handlers: Mapping[str, Handler],
        *,
        group: str = "processor-responders",
        after: AfterAnswer | None = None,
        on_cancel: OnCancel | None = None,
    ) -> None:
        self._after = after
        self._on_cancel = on_cancel
        self.cancelled = 0  # cancel notices seen for our targets
        self._transport = transport
        self._topology = topology
        self._handlers = dict(handlers)
        self._group = group
        self.answered = 0

    def run(self, stop: threading.Event) -> None:
        topics = [self._topology.name(TopicName.REQUESTS)]
        consumer = self._transport.consumer(self._group, topics)
        client = CompletionClient(self._transport, self._topology)
        try:
            while not stop.is_set():
                try:
                    records = consumer.poll(200, 0.1)
                    self._answer(records, client)
                    client.flush()
                    consumer.commit({r.position: r.offset + 1 for r in records})
                except FencedError as exc:  # the group forgot it: a new member, same work
                    logger.warning("responder: consumer dead, joining again: %s", exc)
                    consumer.close()
                    rejoined = join_until_stopped(
                        self._transport, self._group, topics, stop, who="responder"
                    )
                    if rejoined is None:
                        return
                    consumer = rejoined
                except TransportError as exc:
                    logger.warning("responder: transport error, retrying: %s", exc)
                    stop.wait(0.5)
        finally:
            consumer.close()
            client.close()

    def _answer(self, records: list[Any], client: CompletionClient) -> None:
        for record in records:
            wire: Wire = "json" if json_wire.is_json_request(record.headers) else "avro"
            request = (
                json_wire.decode_request(record.value)
                if wire == "json"
                else codec().decode_as(record.value, BoundaryRequest)
            )
            handler = self._handlers.get(request.target)
            if handler is None:
                continue
            if request.cancel is not None:
                self.cancelled += 1
                if self._on_cancel is not None:
                    self._on_cancel(request)
                continue
            token = request.resume_token
            try:
                value = handler(request, payload.loads(request.request))
            except Exception as exc:  # the simulated system reports failures as completions
                sent = client.send(token, "failure", b"", str(exc), flush=False, wire=wire)
            else:
                body = payload.dumps(value)
                sent = client.send(token, "success", body, None, flush=False, wire=wire)
            self.answered += 1
            if self._after is not None:
                self._after(request, sent, client)
