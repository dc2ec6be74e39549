"""Quarantine: a decision about a run raised (a bug), so the run waits for an operator.

No decision may stop the loop (issue 30). When deciding on a run raises, from a timer,
the fleet wake-up or an input, the engine records ``RunQuarantined`` with
what was being decided and the exception, and goes on with the partition's other
runs. A quarantined run keeps its phase and wait, but arms no timer (``due.py``), is
woken by no worker (``decide_unblock``), and every input about it but ``ReleaseRun``
is refused as ``run_quarantined`` (to admission.rejected with its bytes; a command
also gets its reply). ``ReleaseRun`` (``processor release``), once a fix is deployed,
records ``RunReleased``: its timers are armed again, and fire at once if past due.

Refusals of a release, in order: ``unknown_run``, ``not_quarantined``.
"""

from __future__ import annotations

from processor.facts import keys
from processor.facts.models import ReleaseRun, RunQuarantined, RunReleased
from processor.model.decision import Context, Decision, FactMaker, refuse, replier
from processor.model.operator import response
from processor.model.state import RunState

__all__ = ["MAX_ERROR", "QUARANTINED", "decide_quarantine", "decide_release", "refused"]

#: The refusal of an input about a quarantined run.
QUARANTINED = "run_quarantined"
#: Characters of the exception's message a RunQuarantined keeps.
MAX_ERROR = 1000


def decide_quarantine(
    state: RunState, source: str, error_type: str, error: str, now: int
) -> Decision:
    """Quarantine the run: ``source`` was being decided when ``error_type`` was raised."""
    if state.quarantine is not None:
        return Decision()  # already: the first exception is the one the operator sees
    capped = error if len(error) <= MAX_ERROR else error[: MAX_ERROR - 3] + "..."
    maker = FactMaker(state, state.run_id, now, f"quarantine/{source}")
    header = maker.header(keys.quarantined(maker.base_version + 1))
    maker.add(RunQuarantined(**header, source=source, error_type=error_type, error=capped))
    return maker.decision()


def refused(state: RunState, command_id: str | None) -> Decision:
    """The refusal of an input about a quarantined run (with a reply to a command)."""
    quarantine = state.quarantine
    assert quarantine is not None
    detail = (
        f"run {state.run_id} is quarantined since {quarantine.source} raised "
        f"{quarantine.error_type}: release it (processor release) once fixed"
    )
    if command_id is None:
        return Decision.refuse(QUARANTINED, detail)
    return refuse(replier(command_id, state.run_id), QUARANTINED, detail)


def decide_release(command: ReleaseRun, state: RunState | None, ctx: Context) -> Decision:
    """Release a quarantined run, or refuse with a reason."""
    reply = replier(command.command_id, command.run_id)
    if state is None:
        return refuse(reply, "unknown_run", f"no run {command.run_id}")
    quarantine = state.quarantine
    if quarantine is None:
        return refuse(reply, "not_quarantined", f"run {state.run_id} is not quarantined")
    maker = FactMaker(state, state.run_id, ctx.now, command.command_id, live=ctx.live_versions)
    released = RunReleased(
        **maker.header(keys.released(quarantine.seq)),
        command_id=command.command_id,
        operator=command.operator,
        reason=command.reason,
        quarantined_seq=quarantine.seq,
    )
    maker.add(released)
    answer = response(state, released=quarantine.seq, source=quarantine.source)
    maker.emits.append(reply(True, None, None, answer))
    return maker.decision()
