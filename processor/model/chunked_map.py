"""An immutable map that grows, or changes, by one entry without copying the rest (pure).

A run's maps that grow an entry per fact (a fan-out step's settled items,
``NodeRun.item_outputs`` and ``item_errors``; an await's or child step's interactions,
``RunState.interactions``) are folded one fact at a time, and a fold never changes the
state it was given. With plain dicts each fact copied every earlier entry, so folding
n items cost O(n^2): at 40,000 fan-out items a fifth of the processor loop's time went
to copying dicts. ``ChunkedMap`` keeps its entries in chunks of at most ``CHUNK``:
``with_item`` copies one chunk and the tuple of chunks, and shares the rest.

It reads as a ``Mapping`` (iteration in insertion order, and an entry set again keeps
its place, as a dict's) and is equal to any mapping with the same entries; a row
stores it as the JSON object it stored the dict as (``run_row``; the compiled fold
reads and writes the same object).
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, Mapping, ValuesView
from typing import Any, TypeVar, get_args, overload

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

__all__ = ["CHUNK", "ChunkedMap"]

#: Entries a chunk holds at most: a change copies up to this many, plus one reference
#: per chunk.
CHUNK = 256

K = TypeVar("K")
V = TypeVar("V")
D = TypeVar("D")


class ChunkedMap(Mapping[K, V]):
    """A mapping; ``with_item`` returns a new map, this one is unchanged."""

    __slots__ = ("_chunks", "_len")

    def __init__(self, entries: Mapping[K, V] | None = None) -> None:
        pairs = list((entries or {}).items())
        self._chunks: tuple[dict[K, V], ...] = tuple(
            dict(pairs[start : start + CHUNK]) for start in range(0, len(pairs), CHUNK)
        )
        self._len = len(pairs)

    @classmethod
    def adopting(cls, entries: dict[K, V]) -> ChunkedMap[K, V]:
        """A map of ``entries``, a dict nobody else holds or changes (a validator's or a
        comprehension's fresh one): kept as the one chunk when it fits, not copied."""
        if len(entries) > CHUNK:
            return cls(entries)
        return cls._of_chunks((entries,) if entries else (), len(entries))

    @classmethod
    def _of_chunks(cls, chunks: tuple[dict[K, V], ...], length: int) -> ChunkedMap[K, V]:
        made: ChunkedMap[K, V] = cls.__new__(cls)
        made._chunks, made._len = chunks, length
        return made

    def with_item(self, key: K, value: V) -> ChunkedMap[K, V]:
        """This map with ``key`` set to ``value`` (in its place if it was there)."""
        chunks = self._chunks
        if len(chunks) == 1:  # most maps: one chunk, copied as a dict would be
            (only,) = chunks
            if key in only or len(only) < CHUNK:
                return self._of_chunks(({**only, key: value},), self._len + (key not in only))
        for index, chunk in enumerate(chunks):
            if key in chunk:
                changed = (*chunks[:index], {**chunk, key: value}, *chunks[index + 1 :])
                return self._of_chunks(changed, self._len)
        if chunks and len(chunks[-1]) < CHUNK:
            grown = (*chunks[:-1], {**chunks[-1], key: value})
        else:
            grown = (*chunks, {key: value})
        return self._of_chunks(grown, self._len + 1)

    def as_dict(self) -> dict[K, V]:
        """The entries in a dict of the caller's own, in insertion order."""
        whole = self._whole()
        return dict(whole) if len(self._chunks) == 1 else whole

    def _whole(self) -> dict[K, V]:
        """The entries in one dict, to read only: the chunk itself when there is one."""
        chunks = self._chunks
        if len(chunks) == 1:
            return chunks[0]
        merged: dict[K, V] = {}
        for chunk in chunks:
            merged.update(chunk)
        return merged

    def __getitem__(self, key: K) -> V:
        for chunk in self._chunks:
            if key in chunk:
                return chunk[key]
        raise KeyError(key)

    @overload
    def get(self, key: K, /) -> V | None: ...
    @overload
    def get(self, key: K, default: V | D, /) -> V | D: ...
    def get(self, key: K, default: object = None) -> object:
        if len(self._chunks) == 1:
            return self._chunks[0].get(key, default)
        for chunk in self._chunks:
            if key in chunk:
                return chunk[key]
        return default

    def __contains__(self, key: object) -> bool:
        return any(key in chunk for chunk in self._chunks)

    def __iter__(self) -> Iterator[K]:
        return iter(self._whole())

    def items(self) -> ItemsView[K, V]:
        # Mapping's own would look each key up, chunk by chunk. A view: read only.
        return self._whole().items()

    def values(self) -> ValuesView[V]:
        return self._whole().values()

    def __len__(self) -> int:
        return self._len

    def __eq__(self, other: object) -> bool:
        # In one go: a row's write compares the map with its default (empty) on every
        # flush of the run.
        if self is other:
            return True
        if not isinstance(other, Mapping):
            return NotImplemented
        if len(other) != self._len:
            return False
        if not self._len:
            return True
        theirs = other._whole() if isinstance(other, ChunkedMap) else dict(other)
        return self._whole() == theirs

    __hash__ = None  # type: ignore[assignment]  # as a dict's: it compares by content

    def __copy__(self) -> ChunkedMap[K, V]:
        return self  # immutable: a copy would be the same map

    def __deepcopy__(self, memo: dict[int, Any]) -> ChunkedMap[K, V]:
        # Pydantic copies a field's default for every model it builds without the
        # field (every run row read without interactions): the same map will do.
        return self

    def __repr__(self) -> str:
        return f"ChunkedMap({self.as_dict()!r})"

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        """Validated and serialized as the dict it stands for (a row's JSON object)."""
        key_type, value_type = get_args(source) or (Any, Any)
        as_dict = handler.generate_schema(dict[key_type, value_type])  # type: ignore[valid-type]
        return core_schema.no_info_after_validator_function(
            cls.adopting,
            as_dict,
            serialization=core_schema.plain_serializer_function_ser_schema(
                _as_dict, return_schema=as_dict
            ),
        )


def _as_dict(value: Mapping[Any, Any]) -> Mapping[Any, Any]:
    return value._whole() if isinstance(value, ChunkedMap) else value
