"""The end of a run's forward work: succeed now, or prepare the terminal publication.

Shared by chains (``transitions``) and graphs (``graph_run``); the publication itself
is ``transitions.publish``.
"""

from __future__ import annotations

from processor.facts import keys
from processor.facts.models import RunSucceeded, TerminalPublicationPrepared
from processor.facts.topics import TopicName
from processor.model.decision import FactMaker
from processor.model.pipeline_spec import PipelineSpec

__all__ = ["finish_success", "succeed"]


def finish_success(maker: FactMaker, spec: PipelineSpec) -> None:
    """Succeed now, or prepare the terminal publication first when the pipeline has one."""
    state = maker.current
    targets = _publication_targets(spec)
    if targets:
        key = f"{state.run_id}/terminal"
        for topic in targets:
            maker.add(
                TerminalPublicationPrepared(
                    **maker.header(keys.publication_prepared(topic)),
                    topic=topic,
                    idempotency_key=key,
                )
            )
        return
    succeed(maker)


def succeed(maker: FactMaker) -> None:
    state = maker.current
    maker.add(RunSucceeded(**maker.header(keys.TERMINAL), result=state.last_output))
    maker.emit_outcome("succeeded", result=state.last_output)


def _publication_targets(spec: PipelineSpec) -> list[str]:
    targets = []
    if spec.output_topic:
        targets.append(spec.output_topic)
    if spec.checkpoint is not None:
        targets.append(TopicName.CHECKPOINTS.value)
    return targets
