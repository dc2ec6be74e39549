"""A child run's link to its parent, and the outcome it reports back (pure).

A child run (``processor.model.children``) records ``ChildRunLinked`` right after its
``RunSubmitted``; its projection keeps the link. When the child ends, however it ends,
its outcome goes to the parent's partition as a ``BoundaryCompletion`` carrying the
resume token of the parent's interaction, so it passes the same admission stage as an
await completion.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from processor.facts.models import BoundaryCompletion

__all__ = ["ParentLink", "parent_completion"]


class ParentLink(BaseModel):
    """Whose child a run is: the parent run, its interaction's token, the nesting depth."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str
    token: str
    depth: int


def parent_completion(
    run_id: str, parent: ParentLink, status: str, result: bytes | None, error: str | None
) -> BoundaryCompletion:
    """The completion of the parent's interaction by child ``run_id`` ending in ``status``:
    a success with its result, else a failure naming the child and how it ended."""
    if status == "succeeded":
        return BoundaryCompletion(
            token=parent.token,
            idempotency_key=f"child/{run_id}",
            outcome="success",
            payload=result if result is not None else b"null",
            error=None,
            content_type="application/json",
        )
    return BoundaryCompletion(
        token=parent.token,
        idempotency_key=f"child/{run_id}",
        outcome="failure",
        payload=b"null",
        error=f"child run {run_id} {status}" + (f": {error}" if error else ""),
        content_type="application/json",
    )
