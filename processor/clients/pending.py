"""Pending requests: the open interactions of waiting runs, with their resume tokens.

Only a token's SHA-256 digest is stored, but a token is a deterministic HMAC of
its claims (run, boundary, interaction, epoch), so it is minted again here with
the resume keys and kept only if its digest is the one the interaction stores:
what is shown is exactly the token the processor issued, and a token that no
configured key makes (its key was removed since) is shown as None rather than
guessed. Nothing is read from boundary.requests.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from processor.facts import tokens
from processor.facts.codec import decode_fact
from processor.facts.keyring import KeyRing
from processor.facts.models import BoundaryInteractionDispatched
from processor.model import waits
from processor.model.state import Interaction, RunState
from processor.store.listing import waiting_runs
from processor.store.rocks import PartitionStore, partition_of

__all__ = ["PendingRequest", "pending_requests"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PendingRequest:
    """One open interaction of a suspended run and the token that completes it."""

    run_id: str
    boundary: int
    item_index: int
    kind: str
    target: str
    deadline_ms: int
    token: str | None  # None: no configured resume key made it
    partition: int

    def as_dict(self) -> dict[str, Any]:
        """The JSON shape of ``processor requests`` and ``GET /api/requests``."""
        return asdict(self)


def pending_requests(
    stores: Sequence[PartitionStore], keys: KeyRing, run_id: str | None, target: str | None
) -> list[PendingRequest]:
    """The open interactions in ``stores`` (of ``run_id``, on ``target``), soonest deadline first.

    Reads what the stores have applied: a request dispatched a moment ago may not be
    listed yet, one admitted a moment ago may still be.
    """
    found = [
        request
        for partition, store, state in _waiting(stores, run_id, target)
        for request in _requests_of(state, store, partition, keys, target)
    ]
    return sorted(found, key=lambda r: (r.deadline_ms, r.run_id, r.boundary, r.item_index))


def _waiting(
    stores: Sequence[PartitionStore], run_id: str | None, target: str | None
) -> Iterator[tuple[int, PartitionStore, RunState]]:
    """(partition, store, state) of each suspended run asked for: the one run, or the
    runs the index lists as waiting (one multi-get of their states per store)."""
    numbered = {_partition_of(store, index): store for index, store in enumerate(stores)}
    if run_id is not None:
        candidates = [(partition, run_id) for partition in numbered]
    else:
        candidates = list(waiting_runs(stores, target))
    for partition, store in numbered.items():
        run_ids = [found for at, found in candidates if at == partition]
        for state in store.runs(run_ids):
            if state is not None:  # a chain, or each step of a graph run, at a boundary
                for view in waits.in_wait(state, waits.SUSPENDED):
                    yield partition, store, view


def _partition_of(store: PartitionStore, index: int) -> int:
    """The partition a store holds, as ``waiting_runs`` numbers it: from its directory
    name (``p0003``), else its place in the sequence."""
    found = partition_of(store.path)
    return index if found is None else found


def _requests_of(
    state: RunState, store: PartitionStore, partition: int, keys: KeyRing, target: str | None
) -> list[PendingRequest]:
    opened = [
        (interaction_id, i)
        for interaction_id, i in state.interactions.items()
        if i.status == "open" and i.boundary == state.boundary.number
        if target is None or i.target == target
    ]
    epochs = _Epochs(state, store)
    return [
        PendingRequest(
            run_id=state.run_id,
            boundary=i.boundary,
            item_index=i.item_index,
            kind=i.kind,
            target=i.target,
            deadline_ms=i.deadline_ms,
            token=_token(keys, state.run_id, interaction_id, i, epochs),
            partition=partition,
        )
        for interaction_id, i in sorted(opened, key=lambda pair: pair[1].item_index)
    ]


class _Epochs:
    """The epochs an interaction's token may carry: the suspended attempt's generation
    (the one it was dispatched with), else the one its dispatch fact records."""

    def __init__(self, state: RunState, store: PartitionStore) -> None:
        self._state = state
        self._store = store
        self._dispatched: dict[str, int] | None = None

    def candidates(self, interaction_id: str) -> Iterator[int]:
        yield self._state.attempt.generation
        if self._dispatched is None:  # read the history once, only when it is needed
            self._dispatched = _dispatch_epochs(self._store.history(self._state.run_id))
        recorded = self._dispatched.get(interaction_id)
        if recorded is not None and recorded != self._state.attempt.generation:
            yield recorded


def _dispatch_epochs(history: Iterable[bytes]) -> dict[str, int]:
    return {
        fact.interaction: fact.epoch
        for fact in map(decode_fact, history)
        if isinstance(fact, BoundaryInteractionDispatched)
    }


def _token(
    keys: KeyRing, run_id: str, interaction_id: str, interaction: Interaction, epochs: _Epochs
) -> str | None:
    """The token whose digest the interaction stores, minted again; None if no key makes it."""
    if not interaction.token_digest:  # the start boundary of a run begun from a checkpoint
        return None
    for epoch in epochs.candidates(interaction_id):
        claims = tokens.TokenClaims(run_id, interaction.boundary, interaction_id, epoch)
        for key in keys.keys:  # the signing key first: it made every token since it was added
            token = tokens.sign(KeyRing((key,)), claims)
            if tokens.digest(token) == interaction.token_digest:
                return token
    logger.warning("%s/%s: no resume key makes its token", run_id, interaction_id)
    return None
