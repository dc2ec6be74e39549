"""Segments run where they are decided (``PROCESSOR_INLINE_STEPS``).

A work item the loop dispatches normally goes out on segments.work; a worker runs it
and its result comes back on segments.results: two records, two hops and a
transaction more per segment. With inline steps on, the loop runs a segment of a
pipeline its own application loads before it commits, and decides the result in the
same batch: the decision that dispatched the segment, the steps' outputs and what
follows them (the next segment, an await's request, the outcome) commit together.

Steps stay at least once: a batch that does not commit is decided again, and its
segments run again, as a worker's would after a crash. What is not run here goes out
as before: a segment with an ``async def`` step (it would hold the loop for as long
as it awaits), one that must be claimed before it runs (an effectful step, run at
most once: the claim needs a round trip), one with a step that heartbeats (it says it
takes long) or is declared ``step(inline=False)``, a pipeline declared
``Pipeline(..., inline=False)``, a version this application does not load, and any
beyond ``limit`` a batch (a fan-out of thousands would hold its partition).
A step here runs on the loop's thread: it holds up every run of the process while it
runs, so inline steps are for quick ones (no step timeout can interrupt one).
"""

from __future__ import annotations

from dataclasses import dataclass

from processor.facts.models import SegmentResult, WorkItem
from processor.facts.topics import TopicName
from processor.model.decision import Emit, LiveVersions
from processor.model.state import RunState
from processor.telemetry import logs
from processor.worker.executor import execute, needs_loop, not_run, segment_steps
from processor.worker.pipeline import Application

__all__ = ["InlineSegment", "InlineSteps"]


@dataclass(frozen=True, slots=True)
class InlineSegment:
    """A work item kept back to run in the loop (``emit``, as it would have gone out),
    with its run's partition and trace."""

    partition: int
    emit: Emit
    trace: str | None

    @property
    def item(self) -> WorkItem:
        assert isinstance(self.emit.value, WorkItem)  # InlineSteps.takes said so
        return self.emit.value

    @property
    def run_id(self) -> str:
        return self.item.run_id


class InlineSteps:
    """Which work items the loop runs itself, and how."""

    def __init__(
        self, app: Application, worker_id: str, max_payload_bytes: int, limit: int
    ) -> None:
        self._app = app
        self.worker_id = worker_id
        self._max_payload_bytes = max_payload_bytes
        self.limit = limit
        self.versions: LiveVersions = frozenset(app.versions)
        # (pipeline, version, kind, first step) -> whether such a segment runs here.
        self._taken: dict[tuple[str, int, str, int], bool] = {}

    def takes(self, emit: Emit) -> bool:
        """Whether ``emit`` is a work item this loop may run itself."""
        item = emit.value
        if emit.topic is not TopicName.WORK or not isinstance(item, WorkItem):
            return False
        key = (item.pipeline, item.pipeline_version, item.kind, item.first_step)
        taken = self._taken.get(key)
        if taken is None:
            taken = self._taken[key] = self._quick(item)
        return taken

    def _quick(self, item: WorkItem) -> bool:
        """Whether the item's segment is one to run here (the module doc): loaded, in a
        pipeline that allows it, sync, unclaimed, and without a step that heartbeats
        (a step that says it takes long) or is declared ``inline=False``."""
        pipeline = self._app.pipeline(item.pipeline, item.pipeline_version)
        spec = self._app.get(item.pipeline, item.pipeline_version)
        steps = segment_steps(item, self._app)
        if pipeline is None or spec is None or steps is None or not pipeline.inline:
            return False
        if spec.needs_claim(item.kind, item.first_step):
            return False
        if any(not step.inline or step.spec.heartbeat_timeout_ms is not None for step in steps):
            return False
        return not needs_loop(item, self._app)

    def run(self, segment: InlineSegment, state: RunState | None) -> SegmentResult:
        """Run the segment's steps here, as a worker would; not a forward segment of a
        run stopping by now (a cancel decided in the same batch, say), whose result
        says it was not run, as a worker's does after the stop notice."""
        item = segment.item
        stopped = state is None or state.terminal or state.stopping
        if stopped and item.kind == "forward":
            return not_run(item, self.worker_id, "its run is stopping")
        with logs.run_context(item.run_id, item.pipeline, item.first_step, item.attempt):
            return execute(
                item,
                self._app,
                self.worker_id,
                segment.trace,
                self._max_payload_bytes,
            )
