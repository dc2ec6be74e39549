"""A pipeline as a graph of nodes: what each step needs, and the checks made when defined.

A node is a step. It names the steps it ``needs`` (by default the ordinary step
declared before it, so a list of steps without needs is a chain), its readiness
``rule``, whether a predicate guards it (``when``; the predicate is user code that the
worker evaluates, the model only records its decision), the ``routes`` it chooses
among if it is a switch, the ``catch`` handler of its failure, whether it is a
``finally`` step, and its ``fan_out`` limits.

The rules the checks enforce (each refusal is a ``ConfigurationError`` naming the step):

- names are unique, needs name existing steps, and the needs have no cycle;
- a route target is a step that needs its switch;
- a catch handler is a step of the graph, handles exactly one step (not itself), needs
  nothing, has no predicate and no other step needs it: its output stands in for the
  handled step's, so successors need the handled step. A switch has no catch handler
  (a handler chooses no route);
- a finally step runs when no other step can run any more: no step needs it, it is
  not a route target, a catch handler or a switch, and it has no catch handler of its
  own. Its ``needs`` only name the outputs it reads; its rule is not consulted;
- a fan-out runs at most ``max_in_flight >= 1`` items at once and tolerates a count
  (``>= 0``) or a percentage (0 to 100) of failed items, inclusive.

Default needs skip handlers and finally steps: the step after a handler needs the step
declared before the handler. Handlers and finally steps need nothing by default. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from types import MappingProxyType

from processor.errors import ConfigurationError
from processor.model.readiness import RULES, Rule

__all__ = ["FanOutLimits", "Graph", "Node", "Tolerance", "build_graph"]


@dataclass(frozen=True, slots=True)
class Tolerance:
    """Failed fan-out items allowed, inclusive: a count, or a percentage of the items.

    The default (a count of 0) is fail-fast.
    """

    count: int | None = None
    percent: float | None = None

    def allows(self, failures: int, total: int) -> bool:
        """Whether ``failures`` out of ``total`` items are within the tolerance."""
        if self.percent is None:
            return failures <= (self.count or 0)
        # The percentage as written (str, not the binary float): 10% of 200 is 20.
        return failures * 100 <= Fraction(str(self.percent)) * total


@dataclass(frozen=True, slots=True)
class FanOutLimits:
    """How a fan-out step maps over its items: at most ``max_in_flight`` at once."""

    max_in_flight: int
    tolerance: Tolerance = field(default_factory=Tolerance)


@dataclass(frozen=True, slots=True)
class Node:
    """One step of a graph. ``needs=None`` asks for the default (see the module doc)."""

    name: str
    needs: tuple[str, ...] | None = None
    rule: Rule = "all_success"
    when: bool = False
    routes: tuple[str, ...] = ()
    catch: str | None = None
    is_finally: bool = False
    fan_out: FanOutLimits | None = None


@dataclass(frozen=True, slots=True)
class Graph:
    """Checked nodes in declaration order, every ``needs`` resolved (never None)."""

    nodes: tuple[Node, ...]
    by_name: Mapping[str, Node]
    #: The step each catch handler handles.
    handles: Mapping[str, str]
    #: The switches that route to each route target.
    switches_of: Mapping[str, tuple[str, ...]]

    def needs(self, name: str) -> tuple[str, ...]:
        """The steps ``name`` needs, resolved."""
        return self.by_name[name].needs or ()


def build_graph(nodes: Sequence[Node]) -> Graph:
    """Resolve default needs and check the definition; raise ``ConfigurationError``."""
    handlers = {n.catch for n in nodes if n.catch is not None}
    resolved = tuple(_resolve_needs(nodes, handlers))
    by_name = _unique(resolved)
    for node in resolved:
        _check_node(node, by_name)
    handles = _check_catches(resolved, by_name)
    switches_of = _check_routes(resolved, by_name)
    _check_needed(resolved, by_name, handles)
    _check_acyclic(resolved)
    return Graph(
        resolved,
        MappingProxyType(by_name),
        MappingProxyType(handles),
        MappingProxyType(switches_of),
    )


def _resolve_needs(nodes: Sequence[Node], handlers: set[str]) -> Iterable[Node]:
    previous: str | None = None
    for node in nodes:
        special = node.is_finally or node.name in handlers
        default = () if special or previous is None else (previous,)
        yield node if node.needs is not None else replace(node, needs=default)
        if not special:
            previous = node.name


def _unique(nodes: tuple[Node, ...]) -> dict[str, Node]:
    by_name: dict[str, Node] = {}
    for node in nodes:
        if node.name in by_name:
            raise ConfigurationError(f"two steps are named {node.name!r}")
        by_name[node.name] = node
    return by_name


def _check_node(node: Node, by_name: Mapping[str, Node]) -> None:
    name = node.name
    if node.rule not in RULES:
        raise ConfigurationError(f"step {name!r} has an unknown rule {node.rule!r}")
    for need in node.needs or ():
        if need not in by_name:
            raise ConfigurationError(f"step {name!r} needs {need!r}, which is not a step")
    if len(set(node.needs or ())) != len(node.needs or ()):
        raise ConfigurationError(f"step {name!r} names a need twice")
    if node.fan_out is not None:
        _check_fan_out(name, node.fan_out)
    if node.is_finally and node.catch is not None:
        raise ConfigurationError(f"finally step {name!r} cannot have a catch handler")


def _check_fan_out(name: str, limits: FanOutLimits) -> None:
    if limits.max_in_flight < 1:
        raise ConfigurationError(
            f"fan-out step {name!r} needs max_in_flight of 1 or more, got {limits.max_in_flight}"
        )
    count, percent = limits.tolerance.count, limits.tolerance.percent
    if count is not None and percent is not None:
        raise ConfigurationError(f"fan-out step {name!r}: a tolerance is a count or a percentage")
    if count is not None and count < 0:
        raise ConfigurationError(f"fan-out step {name!r} tolerates {count} failures: below 0")
    if percent is not None and not 0 <= percent <= 100:
        raise ConfigurationError(f"fan-out step {name!r} tolerates {percent}%: not in 0-100")


def _check_catches(nodes: tuple[Node, ...], by_name: Mapping[str, Node]) -> dict[str, str]:
    handles: dict[str, str] = {}
    for node in nodes:
        handler = node.catch
        if handler is None:
            continue
        if handler not in by_name:
            raise ConfigurationError(f"step {node.name!r} is caught by {handler!r}: not a step")
        if handler == node.name:
            raise ConfigurationError(f"step {node.name!r} cannot catch its own failure")
        if handler in handles:
            raise ConfigurationError(
                f"catch handler {handler!r} handles both {handles[handler]!r} and {node.name!r}"
            )
        if node.routes:
            raise ConfigurationError(f"switch {node.name!r} cannot have a catch handler")
        _check_handler(by_name[handler], node.name)
        handles[handler] = node.name
    return handles


def _check_handler(handler: Node, handled: str) -> None:
    name = handler.name
    if handler.needs:
        raise ConfigurationError(f"catch handler {name!r} of {handled!r} cannot need other steps")
    if handler.when:
        raise ConfigurationError(f"catch handler {name!r} cannot have a predicate")
    if handler.is_finally:
        raise ConfigurationError(f"catch handler {name!r} cannot be a finally step")


def _check_routes(
    nodes: tuple[Node, ...], by_name: Mapping[str, Node]
) -> dict[str, tuple[str, ...]]:
    switches_of: dict[str, tuple[str, ...]] = {}
    for switch in nodes:
        for target in switch.routes:
            if target not in by_name:
                raise ConfigurationError(f"switch {switch.name!r} routes to {target!r}: not a step")
            if by_name[target].is_finally:
                raise ConfigurationError(
                    f"switch {switch.name!r} routes to finally step {target!r}"
                )
            if switch.name not in (by_name[target].needs or ()):
                raise ConfigurationError(
                    f"switch {switch.name!r} routes to {target!r}, which does not need it"
                )
            switches_of[target] = (*switches_of.get(target, ()), switch.name)
    return switches_of


def _check_needed(
    nodes: tuple[Node, ...], by_name: Mapping[str, Node], handles: Mapping[str, str]
) -> None:
    for node in nodes:
        for need in node.needs or ():
            if by_name[need].is_finally:
                raise ConfigurationError(
                    f"step {node.name!r} needs finally step {need!r}: nothing may need a finally"
                )
            if need in handles:
                raise ConfigurationError(
                    f"step {node.name!r} needs catch handler {need!r}: need {handles[need]!r}"
                )


def _check_acyclic(nodes: tuple[Node, ...]) -> None:
    """Depth-first search; a cycle is named in dependency order, e.g. ``a -> b -> a``."""
    needs = {n.name: n.needs or () for n in nodes}
    done: set[str] = set()
    for start in needs:
        path: list[str] = []
        _visit(start, needs, path, done)


def _visit(
    name: str, needs: Mapping[str, tuple[str, ...]], path: list[str], done: set[str]
) -> None:
    if name in done:
        return
    if name in path:
        cycle = [*path[path.index(name) :], name]
        raise ConfigurationError(f"steps form a cycle (each needs the next): {' -> '.join(cycle)}")
    path.append(name)
    for need in needs[name]:
        _visit(need, needs, path, done)
    path.pop()
    done.add(name)
