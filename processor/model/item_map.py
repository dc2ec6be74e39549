"""An immutable map of item indexes to values that grows by an item cheaply (pure).

A fan-out step's settled items (``NodeRun.item_outputs`` and ``item_errors``) are
folded one ``FanOutItemSettled`` at a time, and a fold never changes the state it was
given. With a plain dict each item copied every earlier one, so folding a fan-out of
n items cost O(n^2): at 40,000 items a fifth of the processor loop's time went to
copying dicts. ``ItemMap`` keeps its entries in chunks of at most ``CHUNK``: adding an
item copies the last chunk and the tuple of chunks, and shares the rest.

It reads as a ``Mapping`` (iteration in insertion order, as a dict's) and is equal to
any mapping with the same items; a row stores it as a JSON object, as it stored the
dict (``run_row``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar, get_args

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

__all__ = ["CHUNK", "ItemMap"]

#: Entries a chunk holds at most: adding an item copies up to this many, plus one
#: reference per chunk.
CHUNK = 256

V = TypeVar("V")


class ItemMap(Mapping[int, V], Generic[V]):
    """Item index -> value; ``with_item`` returns a new map, this one is unchanged."""

    __slots__ = ("_chunks", "_len")

    def __init__(self, items: Mapping[int, V] | None = None) -> None:
        entries = list((items or {}).items())
        self._chunks: tuple[dict[int, V], ...] = tuple(
            dict(entries[start : start + CHUNK]) for start in range(0, len(entries), CHUNK)
        )
        self._len = len(entries)

    @classmethod
    def _of_chunks(cls, chunks: tuple[dict[int, V], ...], length: int) -> ItemMap[V]:
        made: ItemMap[V] = cls.__new__(cls)
        made._chunks, made._len = chunks, length
        return made

    def with_item(self, item: int, value: V) -> ItemMap[V]:
        """This map with ``item`` set to ``value`` (in its place if it was there)."""
        chunks = self._chunks
        for index, chunk in enumerate(chunks):
            if item in chunk:
                changed = (*chunks[:index], {**chunk, item: value}, *chunks[index + 1 :])
                return self._of_chunks(changed, self._len)
        if chunks and len(chunks[-1]) < CHUNK:
            grown = (*chunks[:-1], {**chunks[-1], item: value})
        else:
            grown = (*chunks, {item: value})
        return self._of_chunks(grown, self._len + 1)

    def as_dict(self) -> dict[int, V]:
        """The items in one dict, in insertion order."""
        merged: dict[int, V] = {}
        for chunk in self._chunks:
            merged.update(chunk)
        return merged

    def __getitem__(self, item: int) -> V:
        for chunk in self._chunks:
            if item in chunk:
                return chunk[item]
        raise KeyError(item)

    def __contains__(self, item: object) -> bool:
        return any(item in chunk for chunk in self._chunks)

    def __iter__(self) -> Iterator[int]:
        for chunk in self._chunks:
            yield from chunk

    def __len__(self) -> int:
        return self._len

    def __eq__(self, other: object) -> bool:
        # Mapping's own would look every key up, chunk by chunk: a row's write compares
        # the map with its default (empty) on every flush of the run.
        if self is other:
            return True
        if not isinstance(other, Mapping):
            return NotImplemented
        if len(other) != self._len:
            return False
        theirs = other.as_dict() if isinstance(other, ItemMap) else dict(other)
        return self.as_dict() == theirs

    __hash__ = None  # type: ignore[assignment]  # as a dict's: it compares by content

    def __repr__(self) -> str:
        return f"ItemMap({self.as_dict()!r})"

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        """Validated and serialized as the dict it stands for (a row's JSON object)."""
        (value_type,) = get_args(source) or (Any,)
        as_dict = handler.generate_schema(dict[int, value_type])  # type: ignore[valid-type]
        return core_schema.no_info_after_validator_function(
            cls,
            as_dict,
            serialization=core_schema.plain_serializer_function_ser_schema(
                _as_dict, return_schema=as_dict
            ),
        )


def _as_dict(value: ItemMap[Any]) -> dict[int, Any]:
    return value.as_dict()
