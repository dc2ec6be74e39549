"""Run a processor and in-process workers together (``processor run``, ``demo``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from processor.errors import TransportError
from processor.facts.topics import TopicName
from processor.instance import InstanceClaim, claim_instance
from processor.loop import Clock, LoopConfig, ProcessorLoop, wall_clock_ms
from processor.secrets import resume_secret
from processor.settings import Settings
from processor.topology import Topology
from processor.transport.base import TopicSpec, Transport
from processor.transport.factory import open_transport
from processor.worker.pipeline import Application
from processor.worker.service import Worker

__all__ = ["Deployment", "Host", "ensure_topics"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Deployment:
    """The settings, log and topics that one command works against."""

    settings: Settings
    transport: Transport
    topology: Topology

    @staticmethod
    def from_settings(settings: Settings) -> Deployment:
        """The deployment ``settings`` name; an existing journal's partition count wins.

        Every client must place run ids on the partitions the topics really have,
        so once runs.facts exists its partition count overrides the setting (which
        only sizes topics that are still to be created).
        """
        transport = open_transport(settings)
        topology = Topology(prefix=settings.topic_prefix, partitions=settings.partitions)
        admin = transport.admin()
        try:
            journal = admin.describe_topics().get(topology.name(TopicName.FACTS))
        finally:
            admin.close()
        if journal is not None and journal.partitions != topology.partitions:
            topology = replace(topology, partitions=journal.partitions)
        return Deployment(settings, transport, topology)


def ensure_topics(deployment: Deployment, app: Application | None = None) -> list[str]:
    """Create the declared topics (and the app's output topics) that are missing."""
    specs = deployment.topology.specs()
    if app is not None:
        partitions = deployment.topology.partitions
        specs += [TopicSpec(name, partitions, {}) for name in app.output_topics]
    admin = deployment.transport.admin()
    try:
        return admin.create_topics(specs)
    finally:
        admin.close()


@dataclass
class Host:
    """A processor loop on one thread and ``workers`` worker threads."""

    deployment: Deployment
    app: Application
    workers: int = 2
    clock: Clock = wall_clock_ms
    instance_id: str = ""  # set by ``start``: the id kept in the state directory
    stop_event: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    loop: ProcessorLoop | None = None
    errors: list[BaseException] = field(default_factory=list)
    _claim: InstanceClaim | None = None

    def start(self) -> None:
        settings = self.deployment.settings
        secret = resume_secret(settings)
        self._claim = claim_instance(settings.state_dir, settings.instance_id)
        self.instance_id = self._claim.instance_id
        try:
            ensure_topics(self.deployment, self.app)
            config = LoopConfig(
                state_dir=settings.state_dir,
                group=settings.group,
                instance_id=self.instance_id,
                max_batch=settings.max_batch,
                poll_timeout_s=settings.poll_timeout_ms / 1000,
                timer_interval_ms=settings.timer_interval_ms,
                resume_secret=secret,
                parallel_restore_min_facts=settings.parallel_restore_min_facts,
                native_fold=settings.native_fold,
            )
            self.loop = ProcessorLoop(
                self.deployment.transport, self.app, self.deployment.topology, config, self.clock
            )
            self.loop.start()
        except BaseException:
            self._release()
            raise
        self._spawn("processor", self._run_loop)
        for index in range(self.workers):
            worker = Worker(
                self.deployment.transport,
                self.app,
                self.deployment.topology,
                group=settings.worker_group,
                worker_id=f"{self.instance_id}-w{index}",
            )
            self._spawn(worker.worker_id, _runner(worker, self.stop_event))

    def _run_loop(self) -> None:
        assert self.loop is not None
        pause = 0.1
        try:
            while not self.stop_event.is_set():
                try:
                    self.loop.run_once()
                    pause = 0.1
                except TransportError as exc:  # the log is unavailable: wait and resume
                    logger.warning("processor: %s; retrying in %.1fs", exc, pause)
                    self.loop.reset_session()
                    self.stop_event.wait(pause)
                    pause = min(pause * 2, 5.0)
        finally:
            self.loop.close()

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        def guarded() -> None:
            try:
                target()
            except BaseException as exc:
                logger.exception("%s crashed", name)
                self.errors.append(exc)
                self.stop_event.set()

        thread = threading.Thread(target=guarded, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self, timeout_s: float = 30.0) -> None:
        self.stop_event.set()
        for thread in self._threads:
            thread.join(timeout_s)
        if not any(thread.is_alive() for thread in self._threads):
            self._release()  # a thread still running may still use the state directory

    def _release(self) -> None:
        if self._claim is not None:
            self._claim.release()
            self._claim = None

    def wait(self) -> None:
        """Block until stopped (by ``stop`` or a crash)."""
        while not self.stop_event.wait(0.5):
            pass


def _runner(worker: Worker, stop: threading.Event) -> Callable[[], None]:
    return lambda: worker.run(stop)
