"""A pipeline and a planted bug for the quarantine test with real processes
(``--app tests.apps.quarantine_pipelines:app``).

Importing this module plants a defect in the processor's sleep timer decision: it
raises for a run whose input names a ``gate`` file that exists. Removing the file is
"deploying the fix"; ``processor release`` then lets the run go on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from processor.model import decide
from processor.model.decision import Context, FactMaker
from processor.model.pipeline_spec import PipelineSpec
from processor.model.timers import DueEntry
from processor.worker.pipeline import Application, Pipeline

__all__ = ["app"]

dozer = Pipeline("dozer")


@dozer.step(timeout_s=5)
def settle(value: dict[str, Any]) -> dict[str, Any]:
    return {**value, "settled": True}


dozer.sleep(0.2, name="doze")


@dozer.step(timeout_s=5)
def rise(value: dict[str, Any]) -> dict[str, Any]:
    return {"risen": value.get("name")}


app = Application([dozer])

_sleep_due = decide.TIMER_DECISIONS["sleep"]


def _planted(maker: FactMaker, spec: PipelineSpec, entry: DueEntry, ctx: Context) -> None:
    gate = json.loads(maker.current.input).get("gate")
    if gate and Path(gate).exists():
        raise RuntimeError(f"planted bug: {gate} exists")
    _sleep_due(maker, spec, entry, ctx)


decide.TIMER_DECISIONS["sleep"] = _planted
