"""Applications that must not run, for ``processor check``: each attribute builds one
when it is first read, so the module imports whatever is wrong with them."""

from __future__ import annotations

from typing import Any

from processor.worker.pipeline import Application, Pipeline

__all__ = ["__getattr__"]


def _twice_named() -> Application:
    twice = Pipeline("twice", version=1)

    @twice.step(name="charge")
    def charge(value: Any) -> Any:
        return value

    @twice.step(name="charge")
    def charge_again(value: Any) -> Any:
        return value

    return Application([twice])


def _no_steps() -> Application:
    return Application([Pipeline("hollow", version=1)])


def _compensates_nothing() -> Application:
    undo = Pipeline("undo", version=1)

    @undo.step()
    def book(value: Any) -> Any:
        return value

    @undo.compensate("bok")  # a typo: no such step
    def unbook(value: Any) -> Any:
        return value

    return Application([undo])


_BUILDERS = {
    "twice_named": _twice_named,
    "no_steps": _no_steps,
    "compensates_nothing": _compensates_nothing,
}


def __getattr__(name: str) -> Application:
    """``broken_pipelines:twice_named`` and the others, built when read."""
    builder = _BUILDERS.get(name)
    if builder is None:
        raise AttributeError(name)
    return builder()
