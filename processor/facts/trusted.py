"""Building frozen pydantic models from values already known to be valid.

Replay folds a million facts; validating each intermediate run projection again
(values that came out of validated facts and projections) is most of its cost.
These helpers build the very instance validation or ``model_copy`` would build,
slot by slot, the way ``model_construct`` does, without the validation or the
generic bookkeeping. Use them only for values whose types are already right.

``SLOT_SETTERS`` is None if the installed pydantic lays models out differently;
every helper then falls back to the public API.

Trusted values, not trusted names: a field the model does not declare is a bug.
``evolve`` and ``assemble`` refuse one (``TypeError``, as ``dataclasses.replace`` does)
rather than write it into the instance as ``model_copy(update=...)`` would; a model
that is ``Evolvable[C]`` has them typed to take ``C``, a TypedDict of its fields, so
that mypy refuses one before anything runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

from pydantic import BaseModel

__all__ = ["SLOT_SETTERS", "Evolvable", "assemble", "builder", "evolve"]

M = TypeVar("M", bound=BaseModel)
C = TypeVar("C", bound=Mapping[str, object])
K = TypeVar("K", bound=Iterable[str])

_SLOTS = ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__")


def _slot_setters() -> dict[str, Any] | None:
    """Each BaseModel slot's descriptor ``__set__`` (what ``model_construct`` sets)."""
    setters = {name: getattr(vars(BaseModel).get(name), "__set__", None) for name in _SLOTS}
    return None if any(setter is None for setter in setters.values()) else setters


SLOT_SETTERS = _slot_setters()
_new = object.__new__
if SLOT_SETTERS is not None:
    _set_dict, _set_fields_set, _set_extra, _set_private = (SLOT_SETTERS[name] for name in _SLOTS)


def _fill(instance: BaseModel, fields: dict[str, Any], fields_set: set[str]) -> None:
    _set_dict(instance, fields)
    _set_fields_set(instance, fields_set)
    _set_extra(instance, None)
    _set_private(instance, None)


def assemble(model: type[M], values: Mapping[str, Any]) -> M:
    """``model(**values)`` for values of the right types; unset fields take their defaults.

    Defaults are shared between instances, which is safe for the frozen models this
    is used with as long as nobody mutates a field value in place (nothing does:
    every change builds a new value).
    """
    template = _TEMPLATES.get(model) or _template(model)
    if template is None:
        _refuse_undeclared(model, values)
        return model.model_validate(values)
    fields = template.fields.copy()  # every field, in declaration order
    fields.update(values)  # keeps that order
    if len(fields) != len(template.fields) or not template.required <= values.keys():
        _refuse_undeclared(model, values)
        return model.model_validate(values)  # a missing field: validation says
    instance = _new(model)
    _fill(instance, fields, set(values))
    return instance


def builder(model: type[M]) -> Callable[[dict[str, Any]], M]:
    """A function making ``model(**fields)`` of ``fields`` that hold a value of the right
    type for *every* field of ``model`` (the stored row of a run, say): no defaults to
    fill in, nothing checked; ``fields`` becomes the instance's own dictionary.

    Its one caller (``store/run_row.py``) compiles the names of ``fields`` from the
    models' own, once (``tests/unit/test_run_row.py`` checks its table of them); a
    check per call would cost a tenth of a store read."""
    if _template(model) is None:
        return model.model_validate
    new, fill = _new, _fill

    def build(fields: dict[str, Any]) -> M:
        instance = new(model)
        fill(instance, fields, set())
        return instance

    return build


def evolve(instance: M, changes: Mapping[str, Any]) -> M:
    """``instance.model_copy(update=changes)``, for changes of the right types."""
    model = type(instance)
    # The template as cached, without a call: evolve is the hot path of the fold.
    if (_TEMPLATES.get(model) or _template(model)) is None:
        return instance.model_copy(update=dict(_refuse_undeclared(model, changes)))
    own = instance.__dict__
    fields = own.copy()
    fields.update(changes)
    if len(fields) != len(own):  # a name that is no field of the instance
        _refuse_undeclared(model, changes)
    copy = _new(model)
    _fill(copy, fields, instance.__pydantic_fields_set__ | changes.keys())
    return copy


class Evolvable(Generic[C]):
    """``evolve`` and ``assemble`` as a frozen model's own, typed to take its changes
    ``C``: a TypedDict (total=False) of exactly the model's fields and their types, so
    that mypy refuses a change to a field it does not declare, or of another type.

    ``class Sleep(BaseModel, Evolvable[SleepChanges])``, then ``sleep.evolve({...})``.
    """

    __slots__ = ()

    if TYPE_CHECKING:

        def evolve(self, changes: C) -> Self:
            """``evolve(self, changes)``."""
            ...

        @classmethod
        def assemble(cls, values: C) -> Self:
            """``assemble(cls, values)``."""
            ...

    else:
        # The functions themselves, not wrappers around them: no second call on the fold's
        # hot path (looking a method up on a pydantic model costs ~50 ns already).
        evolve = evolve
        assemble = classmethod(assemble)


def _refuse_undeclared(model: type[BaseModel], names: K) -> K:
    """``names``, if each is a field of ``model``; else the bug is named."""
    undeclared = [name for name in names if name not in model.model_fields]
    if undeclared:
        raise TypeError(f"{model.__name__} declares no field {', '.join(map(repr, undeclared))}")
    return names


@dataclass(frozen=True, slots=True)
class _Template:
    fields: dict[str, Any]  # every field in declaration order: its default, or None
    required: frozenset[str]


_TEMPLATES: dict[type[BaseModel], _Template | None] = {}


def _template(model: type[BaseModel]) -> _Template | None:
    """``model``'s fields with their defaults (computed once), or None if it is not plain.

    Plain: nothing that building slot by slot would skip (validators after init,
    extra fields, private attributes), on a pydantic whose slots we know.
    """
    if model in _TEMPLATES:
        return _TEMPLATES[model]
    plain = (
        SLOT_SETTERS is not None
        and model.model_config.get("extra") != "allow"
        and not model.__pydantic_post_init__
        and not model.__private_attributes__
    )
    found = None
    if plain:
        fields = model.model_fields
        found = _Template(
            fields={
                name: None if field.is_required() else field.get_default(call_default_factory=True)
                for name, field in fields.items()
            },
            required=frozenset(name for name, field in fields.items() if field.is_required()),
        )
    _TEMPLATES[model] = found
    return found
