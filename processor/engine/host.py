"""Run a processor and in-process workers together (``processor run``, ``demo``).

The workers run in one child process when the Host knows the application's import
path (``app_ref``), the ``worker_isolation`` setting is ``process`` (the default) and
the clock is the wall clock; else as threads of this process (the test kit's
controllable clock, an Application built in code).

The in-process workers take work only once every one of them has joined the
workers' group (``worker.joining``): a worker joining later would take partitions
away from one that already runs their work items, which would run again.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from processor.config.resume_secret import resume_keys
from processor.engine.guarded import start_guarded
from processor.engine.inline import InlineSteps
from processor.engine.instance import InstanceClaim, claim_instance
from processor.engine.loop import LoopConfig, ProcessorLoop
from processor.engine.schedules import RunEndedReader, ScheduleStage
from processor.engine.trigger import TriggerStage
from processor.engine.worker_process import ChildSpec, WorkerProcess, in_process_workers
from processor.errors import TransportError
from processor.facts.keyring import KeyRing
from processor.store.ownership import OwnershipPublisher
from processor.telemetry.metrics import recording
from processor.transport.clock import Clock, wall_clock_ms
from processor.transport.deployment import Deployment, ensure_topics, journal_durability
from processor.transport.durability import Durability
from processor.worker.joining import JoinGate
from processor.worker.pipeline import Application
from processor.worker.service import Worker

__all__ = ["Host"]

logger = logging.getLogger(__name__)


@dataclass
class Host:
    """A processor loop on one thread and ``workers`` workers, each running up to
    ``concurrency`` attempts at once (None: the ``worker_concurrency`` setting), in a
    child process when ``app_ref`` (``module:attribute`` of ``app``) is given."""

    deployment: Deployment
    app: Application
    workers: int = 2
    concurrency: int | None = None
    clock: Clock = wall_clock_ms
    app_ref: str | None = None
    instance_id: str = ""  # set by ``start``: the id kept in the state directory
    stop_event: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _gate: JoinGate | None = None  # when the workers run as threads: opens once all joined
    loop: ProcessorLoop | None = None
    triggers: TriggerStage | None = None  # when the application declares triggers
    schedules: ScheduleStage | None = None  # the schedule stage (engine/schedules.py)
    errors: list[BaseException] = field(default_factory=list)
    _claim: InstanceClaim | None = None
    _ownership: OwnershipPublisher | None = None  # what the loop owns, for local readers
    worker_process: WorkerProcess | None = None  # when the workers run in a child
    durability: Durability | None = None  # what the journal gives a commit, once started
    #: Called after each processor round with the monotonic time it started (the test
    #: kit waits on it: a round begun after the clock moved has seen the new time).
    on_round: Callable[[float], None] | None = None

    def start(self) -> None:
        settings = self.deployment.settings
        keys = KeyRing(resume_keys(settings))
        self._claim = claim_instance(settings.state_dir, settings.instance_id)
        self.instance_id = self._claim.instance_id
        try:
            self._ownership = OwnershipPublisher(settings.state_dir, self.instance_id)
            user_topics = [*self.app.output_topics, *settings.declared_emit_topics]
            ensure_topics(self.deployment, user_topics)
            self.durability = journal_durability(self.deployment)
            logger.info("%s", self.durability.describe())
            self.triggers = self._trigger_stage()  # before the loop: a bad decoder name fails
            config = LoopConfig.from_settings(
                settings, instance_id=self.instance_id, resume_keys=keys
            )
            self.loop = ProcessorLoop(
                self.deployment.transport,
                self.app,
                self.deployment.topology,
                config,
                self.clock,
                on_owned=self._ownership.publish,
                inline=self._inline_steps(),
            )
            self.loop.start()
        except BaseException:
            self._release()
            raise
        self._spawn("processor", self._run_loop)
        if self.triggers is not None:
            logger.info("triggers on %s", ", ".join(self.triggers.topics))
            self._spawn("triggers", _runner(self.triggers, self.stop_event))
        self.schedules = self._schedule_stage()
        self._spawn("schedules", _runner(self.schedules, self.stop_event))
        self._start_workers()

    def _start_workers(self) -> None:
        if self._workers_apart():
            self._start_worker_process()
            return
        self._gate = JoinGate(self.workers)
        workers = in_process_workers(
            self.deployment,
            self.app,
            self.instance_id,
            count=self.workers,
            concurrency=self.concurrency,
            clock=self.clock,
            gate=self._gate,
        )
        for worker in workers:
            self._spawn(worker.worker_id, _runner(worker, self.stop_event))

    def _workers_apart(self) -> bool:
        """Whether the workers run in a child process (module docstring)."""
        settings = self.deployment.settings
        return (
            self.workers > 0
            and self.app_ref is not None
            and settings.worker_isolation == "process"
            and self.clock is wall_clock_ms
        )

    def _start_worker_process(self) -> None:
        assert self.app_ref is not None
        spec = ChildSpec(
            app_ref=self.app_ref,
            settings=self.deployment.settings,
            instance_id=self.instance_id,
            workers=self.workers,
            concurrency=self.concurrency,
            recording=recording(),
            log_level=logging.getLogger().level,
            sys_path=tuple(sys.path),
        )
        self.worker_process = WorkerProcess(spec, self._worker_process_ended)
        self.worker_process.start()

    def workers_ready(self, timeout_s: float) -> bool:
        """Wait until every in-process worker has joined its group and takes work (a
        child's say so)."""
        if self.worker_process is not None:
            return self.worker_process.wait_ready(timeout_s)
        return self._gate is None or self._gate.opened.wait(timeout_s)

    def _worker_process_ended(self, reason: BaseException) -> None:
        logger.error("%s: stopping", reason)
        self.errors.append(reason)
        self.stop_event.set()

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

    def _inline_steps(self) -> InlineSteps | None:
        """What the loop runs itself (PROCESSOR_INLINE_STEPS), if on and the
        application loads any pipeline."""
        settings = self.deployment.settings
        if not settings.inline_steps or not self.app.versions:
            return None
        worker_id = f"{self.instance_id}-inline"
        logger.info("inline steps: %s runs segments of its own pipelines", worker_id)
        return InlineSteps(self.app, worker_id, settings.max_payload_bytes, settings.max_batch)

    def _schedule_stage(self) -> ScheduleStage:
        deployment = self.deployment
        return ScheduleStage(
            deployment.transport,
            deployment.topology,
            group=deployment.settings.group,
            instance_id=self.instance_id,
            pipelines=frozenset(self.app.names),
            run_ended=RunEndedReader(
                deployment.transport, deployment.topology, deployment.settings.state_dir
            ),
            clock=self.clock,
            snapshots=deployment.settings.state_dir / "schedules",
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
        self._threads.append(start_guarded(name, target, self.errors, self.stop_event))

    def stop(self, timeout_s: float = 30.0) -> None:
        self.stop_event.set()
        if self.worker_process is not None:
            self.worker_process.stop(timeout_s)
        for thread in self._threads:
            thread.join(timeout_s)
        if not any(thread.is_alive() for thread in self._threads):
            self._release()  # a thread still running may still use the state directory

    def _release(self) -> None:
        if self._ownership is not None:
            self._ownership.close()
            self._ownership = None
        if self._claim is not None:
            self._claim.release()
            self._claim = None

    def wait(self) -> None:
        """Block until stopped (by ``stop`` or a crash)."""
        while not self.stop_event.wait(0.5):
            pass


def _runner(
    service: Worker | TriggerStage | ScheduleStage, stop: threading.Event
) -> Callable[[], None]:
    return lambda: service.run(stop)
