"""Log records as text (the default) or as one JSON object per line.

Records about a run carry its ``run_id``, ``pipeline``, ``step`` and ``attempt``.
They come from the run context of the code that logs: the processor loop and the
worker name the run of each input they handle (``run_scope`` + ``bind_run``, or
``run_context``), so that whatever is logged meanwhile, in any module, is about
that run; or from ``extra=run_extra(...)`` on one call. Contexts are
``contextvars``: each thread (and task) has its own.

``PROCESSOR_LOG_FORMAT=json`` (``configure_logging("json")``) gives lines like::

    {"time": "2026-12-01T23:50:01.123+00:00", "level": "INFO", "logger": "processor.engine.loop",
     "message": "...", "run_id": "...", "pipeline": "orders", "step": 1, "attempt": 2}
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

__all__ = [
    "LOG_FORMATS",
    "RUN_FIELDS",
    "TEXT_FORMAT",
    "JsonFormatter",
    "LogFormat",
    "RunFields",
    "bind_run",
    "bind_step",
    "configure_logging",
    "current_run",
    "run_context",
    "run_extra",
    "run_scope",
]

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")
#: The fields of a record about a run, in every JSON record that has a run id.
RUN_FIELDS = ("run_id", "pipeline", "step", "attempt")
#: The text format, as the CLI has always logged.
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Marks the handler configure_logging installed, so a second call replaces only it.
_OURS = "_processor_handler"


@dataclass(frozen=True, slots=True)
class RunFields:
    """The run a log record is about; None where not known at that point."""

    run_id: str
    pipeline: str | None = None
    step: int | None = None
    attempt: int | None = None


_CURRENT: ContextVar[RunFields | None] = ContextVar("processor_log_run", default=None)


def current_run() -> RunFields | None:
    """The run the code running now is about, if it named one."""
    return _CURRENT.get()


@contextmanager
def run_scope() -> Iterator[None]:
    """A scope in which ``bind_run`` may name the run; the previous context comes back
    at its end."""
    token = _CURRENT.set(None)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def bind_run(
    run_id: str, pipeline: str | None = None, step: int | None = None, attempt: int | None = None
) -> None:
    """Name the run the current scope (``run_scope``) is about."""
    _CURRENT.set(RunFields(run_id, pipeline, step, attempt))


def bind_step(step: int) -> None:
    """Name the step of the current run, once the code reaches it."""
    current = _CURRENT.get()
    if current is not None:
        _CURRENT.set(RunFields(current.run_id, current.pipeline, step, current.attempt))


@contextmanager
def run_context(
    run_id: str, pipeline: str | None = None, step: int | None = None, attempt: int | None = None
) -> Iterator[None]:
    """A scope about one run: ``run_scope`` and ``bind_run`` in one."""
    token = _CURRENT.set(RunFields(run_id, pipeline, step, attempt))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def run_extra(
    run_id: str, pipeline: str | None = None, step: int | None = None, attempt: int | None = None
) -> dict[str, Any]:
    """``extra=`` for one log call about a run (it wins over the run context)."""
    return {"run": RunFields(run_id, pipeline, step, attempt)}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, the run fields."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        event = getattr(record, "event", None)
        if isinstance(event, str):  # a named event (``extra={"event": "deadline_warning"}``)
            doc["event"] = event
        run = getattr(record, "run", None)
        if not isinstance(run, RunFields):
            run = _CURRENT.get()
        if run is not None:
            doc.update(dataclasses.asdict(run))
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return json.dumps(doc, ensure_ascii=False, default=str)


def configure_logging(format: LogFormat = "text", level: int = logging.WARNING) -> None:
    """Log to stderr in ``format`` at ``level`` (what the CLI does before each command).

    Like ``logging.basicConfig``, it leaves a root logger that the embedding program
    configured alone; a second call replaces what the first installed.
    """
    if format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, not {format!r}")
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, _OURS, False)]:
        root.removeHandler(handler)
    if root.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if format == "json" else logging.Formatter(TEXT_FORMAT))
    setattr(handler, _OURS, True)
    root.addHandler(handler)
    root.setLevel(level)
