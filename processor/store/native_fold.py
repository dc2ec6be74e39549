"""The replay fold compiled: ``processor_native`` (the Rust crate in ``native/``).

Catch-up folds every fact of a partition; in Python, decoding and folding a fact
costs several times reading it. The extension decodes a batch of encoded facts,
folds them and puts into the WriteBatch the rows that ``Staging.fold_read`` and
``flush`` would write (history chunks, runs, due-work and runs-index changes), in one
call. It handles the current schemas of the fact types it declares (``covered_fact_types``:
the kernel refuses to be built with any other) exactly and refuses (ValueError, before
putting anything) whatever else: a fact of a type it does not cover (a new one, folded
only by a Python reducer so far), a value in an older schema, a malformed one, a stored
run it cannot read. That batch is then folded by the Python reducers, which stay the
reference; tests/unit/test_native_fold.py folds the same facts both ways and compares
every row.

It is optional: without the extension (no Rust toolchain at install), or with
``PROCESSOR_NATIVE_FOLD=false``, catch-up folds in Python, only slower.
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from processor.facts.codec import SCHEMA_DIR, codec
from processor.facts.models import FACT_TYPES, FactHeader
from processor.store.rocks import PartitionStore
from processor.store.run_row import RunRow

__all__ = ["NativeFold", "covered_fact_types", "native_fold_available", "parse_fact_schemas"]

#: The column families the compiled fold writes, in the order it takes them. An
#: extension built for other families (an older build: a claims family where the index
#: is now) declares others, or none, and is not used.
_FAMILIES = ("history", "runs", "due", "index")
#: The run row's fields the compiled fold must write (``native/src/state.rs``
#: ``ROW_FIELDS``): a build from before a field was added is not used. ``redrives`` and
#: ``quarantine`` are not among them: such a run's batches are folded in Python.
_PYTHON_ONLY_FIELDS = ("redrives", "quarantine", "lanes", "nodes", "parent", "schedule")
_ROW_FIELDS = tuple(name for name in RunRow.model_fields if name not in _PYTHON_ONLY_FIELDS)
#: A fact type an extension must fold to be used: one built before it knows neither the
#: phase it starts nor that phase's runs-index row, and would leave stale rows.
_REQUIRED = "RunDefinitionBlocked"

logger = logging.getLogger(__name__)


class _Kernel(Protocol):
    def reset(self) -> None: ...

    def fold_into(
        self,
        values: Sequence[bytes | None],
        load: Callable[[list[bytes]], list[bytes | None]],
        put: Callable[[bytes, bytes, Any], None],
        delete: Callable[[bytes, Any], None],
        families: tuple[Any, ...],
    ) -> int: ...


def _extension() -> Any | None:
    try:
        extension = importlib.import_module("processor_native")
    except ImportError:
        return None
    if tuple(getattr(extension, "FAMILIES", ())) != _FAMILIES:
        logger.warning(
            "processor_native writes other column families than %s (an older build); "
            "folding in Python: reinstall native/",
            _FAMILIES,
        )
        return None
    if tuple(getattr(extension, "ROW_FIELDS", ())) != _ROW_FIELDS:
        logger.warning(
            "processor_native writes other run row fields (an older build); "
            "folding in Python: reinstall native/"
        )
        return None
    if not _folds(extension, _REQUIRED):
        logger.warning(
            "processor_native does not fold %s (an older build): its rows of runs in "
            "phase definition_blocked would be wrong; folding in Python: reinstall native/",
            _REQUIRED,
        )
        return None
    return extension


def _folds(extension: Any, name: str) -> bool:
    """Whether the extension's kernel folds the fact type ``name`` (any fingerprint)."""
    declared = (SCHEMA_DIR / f"{name}.avsc").read_text()
    try:
        extension.Kernel([(bytes(8), declared)])
    except ValueError:
        return False
    return True


_EXTENSION = _extension()


def native_fold_available() -> bool:
    """Whether the compiled fold is installed."""
    return _EXTENSION is not None


def parse_fact_schemas() -> None:
    """Parse the fact schemas now (the codec's and the compiled fold's), once per process."""
    _fact_schemas()


def covered_fact_types() -> tuple[type[FactHeader], ...]:
    """The fact types the compiled fold folds (none without the extension); a batch
    with any other fact type is folded in Python."""
    return tuple(model for model, _ in _covered())


@functools.cache
def _fact_schemas() -> list[tuple[bytes, str]]:
    """(fingerprint, declared schema JSON) of the current schema of every fact type the
    extension covers, read once."""
    return [schema for _, schema in _covered()]


@functools.cache
def _covered() -> list[tuple[type[FactHeader], tuple[bytes, str]]]:
    """Each fact type the extension covers, with its current schema. The kernel declares
    what it covers by refusing (ValueError) a schema it does not fold; a fact type added
    since it was built is left out here, so it reaches no kernel and its facts make
    the kernel decline their batch (an unknown fingerprint): Python folds them."""
    if _EXTENSION is None:
        return []
    covered = []
    for model in FACT_TYPES:
        declared = (SCHEMA_DIR / f"{model.__name__}.avsc").read_text()
        schema = (codec().fingerprint_of(model), declared)
        try:
            _EXTENSION.Kernel([schema])
        except ValueError:
            logger.info("compiled fold: %s is folded in Python only", model.__name__)
            continue
        covered.append((model, schema))
    return covered


class NativeFold:
    """Folds one partition's batches, in log order, into its store with the extension.

    Like ``Staging(carry=True)``, it keeps each batch's runs for the next batch, so
    it must be the store's only writer between ``reset`` calls.
    """

    def __init__(self, store: PartitionStore) -> None:
        if _EXTENSION is None:
            raise RuntimeError("processor_native is not installed")
        # A store without runs (a replay's, a lost store's): the kernel then knows the
        # runs it has not written are new, and looks none of them up.
        self._kernel: _Kernel = _EXTENSION.Kernel(_fact_schemas(), store.holds_no_runs())
        self._store = store
        #: Runs that began in the batches folded here (not in the store before).
        self.runs_started = 0

    def fold(self, values: Sequence[bytes | None], facts_offset: int) -> bool:
        """Fold ``values`` (None values left out: they are no facts) and write their
        rows with ``facts_offset`` in one WriteBatch, without the write-ahead log (what
        ``Staging.fold_read`` + ``flush(wal=False)`` do); False, with nothing written,
        if the extension does not handle this batch, which must then be folded in
        Python."""
        batch = self._store.batch()
        put, delete, families = batch.writer(_FAMILIES)
        try:
            started = self._kernel.fold_into(values, self._store.raw_runs_at, put, delete, families)
        except ValueError as exc:  # raised before it put anything
            logger.debug("compiled fold declined a batch (%s); folding it in Python", exc)
            return False
        batch.set_facts_offset(facts_offset)
        self._store.write(batch, wal=False)
        self.runs_started += started
        return True

    def reset(self) -> None:
        """Forget the carried runs: the store was written by someone else meanwhile."""
        self._kernel.reset()
