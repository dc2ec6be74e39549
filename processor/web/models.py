"""Request bodies and response shapes of the JSON API (they make the OpenAPI document)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

__all__ = [
    "CancelBody",
    "CommandAnswer",
    "CompletionAnswer",
    "CompletionBody",
    "CompletionDecision",
    "ErrorBody",
    "Health",
    "History",
    "Ready",
    "RedriveBody",
    "ReleaseBody",
    "Requests",
    "RunGraph",
    "RunList",
    "RunStatus",
    "SubmitAnswer",
    "SubmitBody",
    "TopicRecords",
]

_STRICT = ConfigDict(extra="forbid")
#: The longest run deadline a submit may ask for, in seconds (about 31.7 million years).
MAX_DEADLINE_S = 1e15
_OPEN = ConfigDict(extra="allow")


class ErrorBody(BaseModel):
    error: str = Field(description="A short code users can grep (unknown_run, unauthorized, ...)")
    detail: str


class Health(BaseModel):
    status: Literal["ok"]


class Ready(BaseModel):
    ready: bool
    partitions: list[int] = []
    reason: str | None = None
    quarantined: list[str] = []  # run ids (at most 100): processor release
    skipped: list[str] = []  # run ids whose quarantine itself raised


class SubmitBody(BaseModel):
    model_config = _STRICT

    pipeline: str = Field(min_length=1)
    input: JsonValue = Field(description="The run input, any JSON value")
    idempotency_key: str | None = Field(
        default=None, min_length=1, description="A retry with the same key returns the same run"
    )
    deadline_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_DEADLINE_S,  # in milliseconds, an Avro long with room to spare
        description="Run deadline, seconds after the submit that creates it",
    )


class SubmitAnswer(BaseModel):
    model_config = _OPEN

    run_id: str
    created: bool | None = Field(description="None: queued, no processor answered in time")


class CancelBody(BaseModel):
    model_config = _STRICT

    reason: str = ""


class ReleaseBody(BaseModel):
    model_config = _STRICT

    reason: str = ""


class RedriveBody(BaseModel):
    model_config = _STRICT

    from_step: int | None = Field(default=None, ge=0, le=2**31 - 1)  # an Avro int


class CommandAnswer(BaseModel):
    model_config = _OPEN

    run_id: str
    accepted: bool | None = Field(description="None: queued, no processor answered in time")
    detail: str | None = None


class CompletionBody(BaseModel):
    model_config = _STRICT

    token: str = Field(min_length=1, description="The resume token of the boundary request")
    outcome: Literal["succeeded", "failed"]
    output: JsonValue = Field(default=None, description="The result, when succeeded")
    error: str | None = Field(default=None, description="Why, when failed")
    idempotency_key: str | None = Field(default=None, min_length=1)


class CompletionAnswer(BaseModel):
    """A completion as produced, and what the admission stage made of it (if waited for)."""

    model_config = _OPEN

    queued: bool = Field(description="True: no decision known (not waited for, or none in time)")
    admission: Literal["queued", "admitted", "duplicate"] = Field(
        description="duplicate: the same answer was admitted before (nothing changed)"
    )
    run_id: str
    interaction: str
    outcome: Literal["success", "failure"]
    idempotency_key: str
    partition: int = Field(description="Where the completion was written: its partition")
    offset: int = Field(description="... and its offset in boundary.completions")


class CompletionDecision(BaseModel):
    """What admission decided on a completion, found by its run and idempotency key."""

    model_config = _OPEN

    admission: Literal["admitted", "refused"] = Field(
        description="admitted wins over a refusal of the same key (a later, conflicting copy)"
    )
    run_id: str
    interaction: str = Field(description="As its token names it ('' if it is no token)")
    outcome: Literal["success", "failure"] = Field(description="The answer the completion gave")
    idempotency_key: str
    partition: int = Field(description="Where the completion decided on was written: its partition")
    offset: int = Field(description="... and its offset in boundary.completions")
    decided_ms: int = Field(description="When: the admitted fact's time, or the refusal's (ms)")
    seq: int | None = Field(default=None, description="The admitted fact's seq in the run")
    refusal: str | None = Field(default=None, description="The reason, when refused")
    detail: str | None = None


class RunStatus(BaseModel):
    """The shape of ``processor status --json``."""

    model_config = _OPEN

    run_id: str
    pipeline: str
    status: str
    phase: str


class RunList(BaseModel):
    runs: list[dict[str, Any]]
    next_cursor: str | None
    partitions: list[int]  # the partitions listed: those this processor owns


class RunGraph(BaseModel):
    """A run on its pipeline's graph (``processor/model/graph_view.py``), as of fact ``seq``."""

    model_config = _OPEN

    run_id: str
    pipeline: str
    pipeline_version: int
    status: str
    seq: int = Field(description="The fact the graph reflects (at_seq, or the last)")
    last_seq: int = Field(description="The run's last fact")
    shape: Literal["graph", "chain"]
    nodes: list[dict[str, Any]]
    edges: list[dict[str, Any]]


class History(BaseModel):
    run_id: str
    facts: list[dict[str, Any]]
    next_after: int | None


class Requests(BaseModel):
    requests: list[dict[str, Any]]
    partitions: list[int]  # the partitions listed: those this processor owns


class TopicRecords(BaseModel):
    records: list[dict[str, Any]]
    next_cursor: str | None
