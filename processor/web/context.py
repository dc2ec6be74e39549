"""What the HTTP app needs of the process it runs in: ``WebContext``."""

from __future__ import annotations

import queue
from collections.abc import Callable, Collection, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import SecretStr

from processor.clients.client import Client
from processor.facts.keyring import KeyRing
from processor.model.pipeline_spec import PipelineSpec
from processor.transport.deployment import Deployment
from processor.web.stores import StoreReaders

__all__ = ["STATIC_DIR", "ClientPool", "Readiness", "WebContext"]

#: The inspector page's files (package data).
STATIC_DIR = Path(__file__).with_name("static")


@dataclass(frozen=True, slots=True)
class Readiness:
    """Whether the process serves its partitions, and if not, why."""

    ready: bool
    partitions: list[int] = field(default_factory=list)
    reason: str = ""
    # Runs in quarantine, and runs skipped (not even their quarantine recorded): reported,
    # never a reason to be not ready (the partitions are served; an operator acts).
    quarantined: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


class ClientPool:
    """Clients for the API's request threads: one per concurrent request, reused.

    A client's producers are not shared between threads (the embedded log's is a
    SQLite connection), so each request borrows a client of its own.
    """

    def __init__(self, deployment: Deployment) -> None:
        self._deployment = deployment
        self._idle: queue.SimpleQueue[Client] = queue.SimpleQueue()
        self._all: list[Client] = []

    @contextmanager
    def client(self) -> Iterator[Client]:
        """Borrow a client for the block."""
        try:
            client = self._idle.get_nowait()
        except queue.Empty:
            d = self._deployment
            client = Client(
                d.transport,
                d.topology,
                d.settings.state_dir,
                max_payload_bytes=d.settings.max_payload_bytes,
                group=d.settings.group,
            )
            self._all.append(client)
        try:
            yield client
        finally:
            self._idle.put(client)

    def close(self) -> None:
        for client in self._all:
            client.close()
        self._all.clear()


@dataclass
class WebContext:
    """The running process as the app sees it.

    ``deployment`` is None in a worker: its app serves /healthz, /readyz and
    /metrics only. ``stores`` reads the processor's partition stores (secondary
    instances), those of the partitions ``owned()`` returns (None: every store under
    the state directory); ``clients`` sends commands and completions.
    """

    bind_host: str
    token: SecretStr | None
    readiness: Callable[[], Readiness]
    deployment: Deployment | None = None
    keys: KeyRing | None = None
    static_dir: Path = STATIC_DIR
    clients: ClientPool | None = None
    stores: StoreReaders | None = None
    owned: Callable[[], Collection[int] | None] = lambda: None
    #: The pipeline versions the process loads, by name and version (its graphs).
    pipelines: Callable[[str, int], PipelineSpec | None] = lambda name, version: None

    def __post_init__(self) -> None:
        if self.deployment is not None and self.clients is None:
            self.clients = ClientPool(self.deployment)
        if self.deployment is not None and self.stores is None:
            self.stores = StoreReaders(self.deployment.settings.state_dir)

    def client(self) -> AbstractContextManager[Client]:
        """Borrow a client for one request (a processor's context only)."""
        assert self.clients is not None, "a worker's app has no clients"
        return self.clients.client()

    def close(self) -> None:
        if self.clients is not None:
            self.clients.close()
        if self.stores is not None:
            self.stores.close()
