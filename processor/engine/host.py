"""Run a processor and in-process workers together (``processor run``, ``demo``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from processor.config.resume_secret import resume_keys
from processor.engine.instance import InstanceClaim, claim_instance
from processor.engine.loop import LoopConfig, ProcessorLoop
from processor.engine.trigger import TriggerStage
from processor.errors import TransportError
from processor.facts.keyring import KeyRing
from processor.transport.clock import Clock, wall_clock_ms
from processor.transport.deployment import Deployment, ensure_topics
from processor.worker.pipeline import Application
from processor.worker.service import Worker

__all__ = ["Host"]

logger = logging.getLogger(__name__)


@dataclass
class Host:
    """A processor loop on one thread and ``workers`` workers, each running up to
    ``concurrency`` attempts at once (None: the ``worker_concurrency`` setting)."""

    deployment: Deployment
    app: Application
    workers: int = 2
    concurrency: int | None = None
    clock: Clock = wall_clock_ms
    instance_id: str = ""  # set by ``start``: the id kept in the state directory
    stop_event: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    loop: ProcessorLoop | None = None
    triggers: TriggerStage | None = None  # when the application declares triggers
    errors: list[BaseException] = field(default_factory=list)
    _claim: InstanceClaim | None = None
    #: Called after each processor round with the monotonic time it started (the test
    #: kit waits on it: a round begun after the clock moved has seen the new time).
    on_round: Callable[[float], None] | None = None

    def start(self) -> None:
        settings = self.deployment.settings
        keys = KeyRing(resume_keys(settings))
        self._claim = claim_instance(settings.state_dir, settings.instance_id)
        self.instance_id = self._claim.instance_id
        try:
            ensure_topics(self.deployment, self.app.output_topics)
            self.triggers = self._trigger_stage()  # before the loop: a bad decoder name fails
            config = LoopConfig.from_settings(
                settings, instance_id=self.instance_id, resume_keys=keys
            )
            self.loop = ProcessorLoop(
                self.deployment.transport, self.app, self.deployment.topology, config, self.clock
            )
            self.loop.start()
        except BaseException:
            self._release()
            raise
        self._spawn("processor", self._run_loop)
        if self.triggers is not None:
            logger.info("triggers on %s", ", ".join(self.triggers.topics))
            self._spawn("triggers", _runner(self.triggers, self.stop_event))
        for index in range(self.workers):
            worker = Worker(
                self.deployment.transport,
                self.app,
                self.deployment.topology,
                group=settings.worker_group,
                worker_id=f"{self.instance_id}-w{index}",
                static_member=True,  # kept in the state directory: the same after a restart
                clock=self.clock,  # progress reports and deadline warnings: the same clock
                max_payload_bytes=settings.max_payload_bytes,
                concurrency=self.concurrency or settings.worker_concurrency,
                start_report_after_ms=settings.start_report_after_ms,
                announce_interval_ms=settings.worker_announce_interval_ms,
            )
            self._spawn(worker.worker_id, _runner(worker, self.stop_event))

    def _trigger_stage(self) -> TriggerStage | None:
        """The trigger stage, if any pipeline declares a trigger (its decoders resolved)."""
        declared = self.app.triggers
        if not declared:
            return None
        return TriggerStage(
            self.deployment.transport,
            self.deployment.topology,
            self.deployment.settings,
            declared,
            instance_id=self.instance_id,
            clock=self.clock,
        )

    def _run_loop(self) -> None:
        assert self.loop is not None
        pause = 0.1
        try:
            while not self.stop_event.is_set():
                try:
                    started = time.monotonic()
                    self.loop.run_once()
                    if self.on_round is not None:
                        self.on_round(started)
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


def _runner(service: Worker | TriggerStage, stop: threading.Event) -> Callable[[], None]:
    return lambda: service.run(stop)
