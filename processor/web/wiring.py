"""Serve a running processor (``processor run``) or worker (``processor worker``) over HTTP.

``ProcessorWeb(host)`` serves every route for a started ``Host``;
``WorkerWeb(settings)`` serves /healthz, /readyz and /metrics of a worker process.
Both ``start()`` (returning the address) and ``stop()``.
"""

from __future__ import annotations

import contextlib

from processor.config.resume_secret import resume_keys
from processor.config.settings import Settings, http_port_of
from processor.engine.host import Host
from processor.facts.keyring import KeyRing
from processor.telemetry.metrics import REGISTRY
from processor.web.app import create_app
from processor.web.collector import processor_collectors
from processor.web.context import Readiness, WebContext
from processor.web.server import HttpServer

__all__ = ["ProcessorWeb", "WorkerWeb", "host_partitions", "host_readiness"]


#: Run ids /readyz lists at most of each (the metrics count them all).
_SHOWN = 100


def host_readiness(host: Host) -> Readiness:
    """Ready once the host's loop owns partitions and none is being restored."""
    loop = host.loop
    if host.stop_event.is_set():
        return Readiness(False, reason="stopping")
    if loop is None:
        return Readiness(False, reason="starting")
    if loop.restoring:
        shown = ", ".join(map(str, sorted(loop.restoring)))
        return Readiness(False, reason=f"restoring the stores of partitions {shown}")
    owned = loop.owned_partitions
    if not owned:
        return Readiness(False, reason="no partitions assigned yet")
    quarantined = sorted(
        run for census in list(loop.census.values()) for run in census.quarantined()
    )
    skipped = sorted(loop.skipped_runs)
    return Readiness(True, owned, quarantined=quarantined[:_SHOWN], skipped=skipped[:_SHOWN])


def host_partitions(host: Host) -> list[int]:
    """The partitions whose stores the host's loop has caught up and writes: the API
    lists only those (a revoked partition's store stays on disk, stale)."""
    loop = host.loop
    return [] if loop is None else loop.owned_partitions


class ProcessorWeb:
    """The HTTP server of a started ``Host``: API, page, health and metrics."""

    def __init__(self, host: Host, *, port: int | None = None) -> None:
        deployment = host.deployment
        settings = deployment.settings
        self.context = WebContext(
            bind_host=settings.http_host,
            token=settings.http_token,
            readiness=lambda: host_readiness(host),
            deployment=deployment,
            keys=KeyRing(resume_keys(settings)),
            owned=lambda: host_partitions(host),
            pipelines=host.app.get,
        )
        assert self.context.stores is not None
        self._collectors = processor_collectors(
            lambda: host.loop, deployment.transport.reader(), deployment.topology
        )
        self._server = HttpServer(
            create_app(self.context),
            settings.http_host,
            port if port is not None else http_port_of(settings, "run"),
        )

    @property
    def address(self) -> str:
        """``http://host:port`` once started."""
        return self._server.address

    def start(self) -> str:
        """Register the scrape-time gauges and serve; return the address."""
        for collector in self._collectors:
            REGISTRY.register(collector)
        try:
            return self._server.start()
        except BaseException:
            self._release()
            raise

    def stop(self) -> None:
        self._server.stop()
        self._release()

    def _release(self) -> None:
        for collector in self._collectors:
            with contextlib.suppress(KeyError):  # never registered
                REGISTRY.unregister(collector)
        self._collectors[0].close()
        self.context.close()


class WorkerWeb:
    """A worker process's HTTP server: /healthz, /readyz and /metrics only."""

    def __init__(self, settings: Settings, *, port: int | None = None) -> None:
        context = WebContext(
            bind_host=settings.http_host,
            token=settings.http_token,
            readiness=lambda: Readiness(True),
        )
        chosen = port if port is not None else http_port_of(settings, "worker")
        self._server = HttpServer(create_app(context), settings.http_host, chosen)

    @property
    def address(self) -> str:
        """``http://host:port`` once started."""
        return self._server.address

    def start(self) -> str:
        """Serve; return the address."""
        return self._server.start()

    def stop(self) -> None:
        self._server.stop()
