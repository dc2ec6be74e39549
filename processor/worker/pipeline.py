"""The pipeline definition API: named, versioned pipelines of ordered steps.

```python
orders = Pipeline("orders", version=1, output_topic="orders.done")

@orders.step(retry=RetryPolicy(max_attempts=5), timeout_s=10)
def validate(order: dict) -> dict: ...

@orders.await_step(target="payments", timeout_s=60)
def capture(order: dict) -> dict:          # returns the request for the payment system
    return {"amount": order["total"]}

@orders.step()
def confirm(capture_result: dict) -> dict: ...   # receives the completion payload

orders.sleep(3600)                          # a durable timer: an hour, then the next step

@orders.sleep_until()
def until_ship_date(confirmed: dict) -> int:  # the wake time, from the run's data
    return confirmed["ship_at_ms"]            # epoch ms, an aware datetime, or None

@orders.step()
def ship(confirmed: dict) -> dict: ...      # receives what the step before the sleep returned

app = Application([orders])
```

A pipeline may also start a run for each record of a user's own topic: see
``processor.worker.trigger`` (``Pipeline(..., trigger=Trigger("shop.orders"))`` or
the ``@orders.trigger("shop.orders")`` decorator).

Each step is a plain function taking the previous step's output (the run input
for the first step) and returning a JSON-serializable value. An await step
returns the request payload (a list of them with ``itemized=True``); the run
suspends until the external system completes it (or the timeout passes), and
the next step receives the completion payload (the item outputs, in order). Runs pin the
pipeline version at submit; several versions of one pipeline may be loaded so
runs started on an older version finish on it.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from processor.errors import ConfigurationError, ProcessorError
from processor.facts.json_wire import WIRES, Wire
from processor.model.graph import FanOutLimits, Graph, Node, Tolerance, build_graph
from processor.model.pipeline_spec import (
    AwaitSpec,
    CheckpointSpec,
    CompensationSpec,
    OnTimeout,
    PipelineSpec,
    RetryPolicy,
    SleepSpec,
    StepSpec,
)
from processor.model.readiness import Rule
from processor.worker.emitting import checked_topics
from processor.worker.trigger import Trigger, TriggerRecord

__all__ = ["Application", "NonRetryableError", "Pipeline", "Step", "load_application"]

#: A step, compensator or await-step function: ``(value)`` or ``(value, ctx: StepContext)``,
#: sync or ``async def`` (worker/context.py decides how it is called).
StepFunction = Callable[..., Any]


class NonRetryableError(ProcessorError):
    """Raise from a step to fail its run at once, without retries."""


@dataclass(frozen=True, slots=True)
class Step:
    spec: StepSpec
    function: StepFunction
    compensator: StepFunction | None = None
    #: Where the step sits in a graph: what it needs, its rule, routes, catch handler.
    node: Node | None = None
    #: A graph step's guard: called with its input first; False skips the step.
    predicate: Callable[[Any], bool] | None = None
    #: Whether the processor may run it itself (``PROCESSOR_INLINE_STEPS``).
    inline: bool = True


class Pipeline:
    """A named, versioned, ordered list of steps."""

    def __init__(
        self,
        name: str,
        *,
        version: int = 1,
        output_topic: str | None = None,
        checkpoint: CheckpointSpec | None = None,
        deadline_s: float | None = None,
        trigger: Trigger | None = None,
        emits: Iterable[str] = (),
        inline: bool = True,
    ) -> None:
        """``emits``: the topics its steps may emit events to (``ctx.emit``). ``inline``:
        with ``PROCESSOR_INLINE_STEPS`` on, whether the processor may run this
        pipeline's quick sync segments itself (False: always its workers, as for steps
        that take long; README, "Steps run by the processor itself")."""
        if not name or version < 1:
            raise ConfigurationError("a pipeline needs a name and a version >= 1")
        if checkpoint is not None and not checkpoint.target.startswith(("pipeline:", "run:")):
            raise ConfigurationError("a checkpoint target is pipeline:<name> or run:<id>")
        self.name = name
        self.version = version
        self.output_topic = output_topic
        self.checkpoint = checkpoint
        self.deadline_ms = None if deadline_s is None else int(deadline_s * 1000)
        self.steps: list[Step] = []
        self.triggers: list[Trigger] = [] if trigger is None else [trigger]
        self.emit_topics = checked_topics(emits)
        self.inline = inline

    def step(
        self,
        name: str | None = None,
        *,
        retry: RetryPolicy | None = None,
        timeout_s: float = 30.0,
        effectful: bool = False,
        heartbeat_timeout_s: float | None = None,
        schedule_to_start_timeout_s: float | None = None,
        needs: Iterable[str] | None = None,
        rule: Rule = "all_success",
        routes: Iterable[str] | None = None,
        catch: str | None = None,
        when: Callable[[Any], bool] | None = None,
        inline: bool = True,
    ) -> Callable[[StepFunction], StepFunction]:
        """Decorator appending a step; steps run in the order they are declared.

        A step that names what it ``needs`` makes the pipeline a graph (README:
        "Graphs"): steps that do not need each other run at the same time, and a step
        runs when its readiness ``rule`` holds over its needs' outcomes (``all_success``,
        ``all_done``, ``one_failed``, ``all_failed``, ``none_failed``, ``always``). A step
        with ``routes`` is a switch: its function returns the route(s) to take, the step
        names in ``routes``; the others are skipped. ``catch`` names the step that
        handles this one's failure once its retries are spent. ``when`` guards a graph
        step: called with the step's input before it runs, False skips it
        (``predicate_false``), and the decision is a fact.

        ``timeout_s`` bounds an attempt of the step from when a worker starts it (time
        queued for a worker does not count); ``schedule_to_start_timeout_s``, if given,
        bounds that queue time. With ``heartbeat_timeout_s`` the step must call
        ``ctx.heartbeat()`` at least that often or its attempt is lost at once.
        An ``effectful`` step whose attempt is lost (no result before its timeout)
        is not retried automatically: the run waits for an operator to resolve it.
        ``inline=False``: with ``PROCESSOR_INLINE_STEPS`` on, a segment with this step
        still goes to the workers (a slow or blocking step; README, "Steps run by the
        processor itself").
        """

        def register(function: StepFunction) -> StepFunction:
            spec = StepSpec(
                name=name or function.__name__,
                retry=retry or RetryPolicy(),
                timeout_ms=int(timeout_s * 1000),
                effectful=effectful,
                heartbeat_timeout_ms=_ms(heartbeat_timeout_s),
                schedule_to_start_timeout_ms=_ms(schedule_to_start_timeout_s),
            )
            node = None
            graph = needs is not None or rule != "all_success" or routes or catch is not None
            if graph or when is not None:
                node = Node(
                    spec.name,
                    None if needs is None else tuple(needs),
                    rule,
                    when=when is not None,
                    routes=tuple(routes or ()),
                    catch=catch,
                )
            self.steps.append(Step(spec, function, node=node, predicate=when, inline=inline))
            return function

        return register

    def fan_out(
        self,
        name: str | None = None,
        *,
        max_in_flight: int,
        needs: Iterable[str] | None = None,
        rule: Rule = "all_success",
        tolerate: int | None = None,
        tolerate_percent: float | None = None,
        catch: str | None = None,
        retry: RetryPolicy | None = None,
        timeout_s: float = 30.0,
    ) -> Callable[[StepFunction], StepFunction]:
        """Decorator appending a fan-out step: its input is a list, and its function runs
        once per item, each item an attempt of its own with its own retries, at most
        ``max_in_flight`` at once. By default the first failed item (after its retries)
        fails the step; ``tolerate`` failed items (a count) or ``tolerate_percent`` of
        them (inclusive) are allowed instead. Its output, released once every item
        settled: ``{"items": [...], "failed": [{"item", "type", "message"}]}``, the
        items' outputs in item-index order (null where one failed). The pipeline is
        then a graph (README: "Fan-out").
        """
        if tolerate is not None and tolerate_percent is not None:
            raise ConfigurationError("tolerate a count or a percentage of items, not both")
        limits = FanOutLimits(max_in_flight, Tolerance(tolerate, tolerate_percent))

        def register(function: StepFunction) -> StepFunction:
            spec = StepSpec(
                name or function.__name__, retry or RetryPolicy(), int(timeout_s * 1000)
            )
            node = Node(
                spec.name,
                None if needs is None else tuple(needs),
                rule,
                catch=catch,
                fan_out=limits,
            )
            self.steps.append(Step(spec, function, node=node))
            return function

        return register

    def finally_step(
        self,
        name: str | None = None,
        *,
        needs: Iterable[str] = (),
        retry: RetryPolicy | None = None,
        timeout_s: float = 30.0,
    ) -> Callable[[StepFunction], StepFunction]:
        """Decorator appending a finally step: it runs once when every other step of
        the run has settled, whatever the outcome, and fails the run only if it fails
        itself. It receives the outputs of the steps it ``needs`` (the run input if
        none). The pipeline is then a graph (README: "Graphs")."""

        def register(function: StepFunction) -> StepFunction:
            spec = StepSpec(
                name or function.__name__, retry or RetryPolicy(), int(timeout_s * 1000)
            )
            node = Node(spec.name, tuple(needs), is_finally=True)
            self.steps.append(Step(spec, function, node=node))
            return function

        return register

    def await_step(
        self,
        name: str | None = None,
        *,
        target: str,
        timeout_s: float,
        itemized: bool = False,
        on_timeout: OnTimeout = "fail",
        retry: RetryPolicy | None = None,
        step_timeout_s: float = 30.0,
        wire: Wire = "avro",
        needs: Iterable[str] | None = None,
        catch: str | None = None,
        max_in_flight: int | None = None,
        tolerate: int | None = None,
        tolerate_percent: float | None = None,
    ) -> Callable[[StepFunction], StepFunction]:
        """Decorator appending an await step: the function returns the request(s).

        ``timeout_s`` bounds the wait for completions; ``step_timeout_s`` bounds the
        attempt that computes the requests (a lost attempt is retried after it).
        ``wire="json"`` sends the requests as JSON documents (docs/CONTRACT.md) for
        systems without Avro; completions are accepted in either wire. ``needs`` and
        ``catch`` place it in a graph, as for ``step``. An itemized await sends at most
        ``max_in_flight`` requests at once (the next when one settles) and tolerates
        ``tolerate`` failed items (a count) or ``tolerate_percent`` of them, inclusive,
        as a fan-out step does.
        """
        if wire not in WIRES:
            raise ConfigurationError(f"wire must be one of {WIRES}, got {wire!r}")
        limited = max_in_flight is not None or tolerate is not None or tolerate_percent is not None
        if limited and not itemized:
            raise ConfigurationError("max_in_flight and tolerate are for itemized awaits")
        if max_in_flight is not None and max_in_flight < 1:
            raise ConfigurationError(f"max_in_flight must be 1 or more, got {max_in_flight}")
        if tolerate is not None and tolerate_percent is not None:
            raise ConfigurationError("tolerate a count or a percentage of items, not both")
        tolerance = None
        if tolerate is not None or tolerate_percent is not None:
            tolerance = Tolerance(tolerate, tolerate_percent)
        timeout_ms = int(timeout_s * 1000)
        awaits = AwaitSpec(
            target, timeout_ms, itemized, on_timeout, "await", wire, max_in_flight, tolerance
        )
        step_timeout_ms = int(step_timeout_s * 1000)

        def register(function: StepFunction) -> StepFunction:
            step_name = name or function.__name__
            spec = StepSpec(step_name, retry or RetryPolicy(), step_timeout_ms, awaits)
            self.steps.append(Step(spec, function, node=_graph_node(step_name, needs, catch)))
            return function

        return register

    def child(
        self,
        pipeline: str,
        *,
        timeout_s: float,
        name: str | None = None,
        itemized: bool = False,
        on_timeout: OnTimeout = "fail",
        retry: RetryPolicy | None = None,
        step_timeout_s: float = 30.0,
        needs: Iterable[str] | None = None,
        catch: str | None = None,
        max_in_flight: int | None = None,
        tolerate: int | None = None,
        tolerate_percent: float | None = None,
    ) -> Callable[[StepFunction], StepFunction]:
        """Decorator appending a child step: the function returns the input of one run of
        ``pipeline`` (a list of inputs, one run each, when ``itemized``); the step waits
        for their outcomes, as an await step waits for completions, and returns the
        child's result (the list of results, in item order). ``timeout_s`` bounds the wait
        and each child's deadline (model/children.py; README: "Child runs")."""
        register = self.await_step(
            name,
            target=pipeline,
            timeout_s=timeout_s,
            itemized=itemized,
            on_timeout=on_timeout,
            retry=retry,
            step_timeout_s=step_timeout_s,
            needs=needs,
            catch=catch,
            max_in_flight=max_in_flight,
            tolerate=tolerate,
            tolerate_percent=tolerate_percent,
        )

        def register_child(function: StepFunction) -> StepFunction:
            register(function)
            step = self.steps[-1]
            assert step.spec.awaits is not None
            awaits = replace(step.spec.awaits, kind="child")
            self.steps[-1] = replace(step, spec=replace(step.spec, awaits=awaits))
            return function

        return register_child

    def await_checkpoint(
        self,
        checkpoint: str,
        *,
        timeout_s: float,
        on_timeout: OnTimeout = "fail",
        needs: Iterable[str] | None = None,
    ) -> None:
        """Append a step that waits for another pipeline's checkpoint handoff."""
        awaits = AwaitSpec(checkpoint, int(timeout_s * 1000), False, on_timeout, "checkpoint")
        spec = StepSpec(f"await_{checkpoint}", RetryPolicy(), 30_000, awaits)
        self.steps.append(Step(spec, _unchanged, node=_graph_node(spec.name, needs)))

    def await_event(
        self,
        event: str,
        *,
        timeout_s: float,
        correlate: StepFunction | None = None,
        key: str | None = None,
        on_timeout: OnTimeout = "fail",
        name: str | None = None,
        needs: Iterable[str] | None = None,
        catch: str | None = None,
    ) -> None:
        """Append a step that waits for the event named ``event`` (docs/design/signals.md).

        ``correlate`` maps the step's input to the wait's correlation, an object of
        string fields (``lambda order: {"order": order["id"]}``): an event settles the
        wait when it carries each of them with the same value (it may carry more).
        None: any event of that name for the run. ``key`` names the correlation field
        that lets an event addressed by correlation key (not by run id) reach the wait.
        The wait times out after ``timeout_s`` (0: it only times out); an event admitted
        at or after that loses to the timeout. The next step receives the event's
        payload (``on_timeout="continue"``: ``{"timed_out": true}`` after a timeout).
        """
        if timeout_s < 0:
            raise ConfigurationError(f"an event wait's timeout is 0 s or more, got {timeout_s}")
        awaits = AwaitSpec(event, int(timeout_s * 1000), False, on_timeout, "event", event_key=key)
        spec = StepSpec(name or f"await_{event}", RetryPolicy(), 30_000, awaits)
        function = correlate or _no_correlation
        self.steps.append(Step(spec, function, node=_graph_node(spec.name, needs, catch)))

    def sleep(
        self, seconds: float, *, name: str | None = None, needs: Iterable[str] | None = None
    ) -> None:
        """Append a sleep step: the run waits ``seconds`` on a durable timer from when it
        reaches the step, then the next step receives the previous step's output (in a
        graph, ``needs`` says which steps it follows, and it passes its input on).

        The wake time is recorded once (``SleepStarted``): a restart or a replay does not
        measure the sleep again; a cancel or the run deadline cuts it short.
        """
        if seconds < 0:
            raise ConfigurationError(f"a sleep lasts 0 seconds or more, got {seconds}")
        sleeps = SleepSpec(duration_ms=int(seconds * 1000))
        spec = StepSpec(name or f"sleep_{len(self.steps)}", RetryPolicy(), 30_000, sleeps=sleeps)
        self.steps.append(Step(spec, _unchanged, node=_graph_node(spec.name, needs)))

    def sleep_until(
        self,
        name: str | None = None,
        *,
        retry: RetryPolicy | None = None,
        timeout_s: float = 30.0,
    ) -> Callable[[StepFunction], StepFunction]:
        """Decorator appending a sleep step whose function computes the wake time from
        the previous step's output: epoch milliseconds (int), an aware ``datetime``, or
        None (no sleep). A time already past wakes the run at once. The next step
        receives the previous step's output, not the wake time. The function runs in a
        worker like a step (``retry`` and ``timeout_s`` as for ``step``).
        """

        def register(function: StepFunction) -> StepFunction:
            spec = StepSpec(
                name or function.__name__,
                retry or RetryPolicy(),
                int(timeout_s * 1000),
                sleeps=SleepSpec(duration_ms=None),
            )
            self.steps.append(Step(spec, function))
            return function

        return register

    def compensate(
        self, step: str, *, retry: RetryPolicy | None = None, timeout_s: float = 30.0
    ) -> Callable[[StepFunction], StepFunction]:
        """Decorator registering the compensator of the step named ``step``.

        It receives that step's output and undoes its effect when the run fails,
        is cancelled or times out after the step completed. ``timeout_s`` counts from
        when a worker starts it; the step's ``heartbeat_timeout_s`` and
        ``schedule_to_start_timeout_s`` apply to it too.
        """

        def register(function: StepFunction) -> StepFunction:
            for index, existing in enumerate(self.steps):
                if existing.spec.name == step:
                    policy = CompensationSpec(retry or RetryPolicy(), int(timeout_s * 1000))
                    spec = replace(existing.spec, compensation=policy)
                    # Only the spec and the compensator change: the step keeps its
                    # place in the graph (needs, rule, routes, catch) and its guard.
                    self.steps[index] = replace(existing, spec=spec, compensator=function)
                    return function
            raise ConfigurationError(f"pipeline {self.name!r} has no step named {step!r}")

        return register

    def trigger(
        self, topic: str, *, idempotency_field: str | None = None, decoder: str = "json"
    ) -> Callable[[Callable[[TriggerRecord], Any]], Callable[[TriggerRecord], Any]]:
        """Decorator: start a run for each record of ``topic``; the function makes its input.

        See ``Trigger`` for the arguments; the decorated function is ``to_input``.
        """

        def register(function: Callable[[TriggerRecord], Any]) -> Callable[[TriggerRecord], Any]:
            self.triggers.append(Trigger(topic, function, idempotency_field, decoder))
            return function

        return register

    def spec(self) -> PipelineSpec:
        """The pipeline's definition, checked: a clear error names what is wrong."""
        if not self.steps:
            raise ConfigurationError(f"pipeline {self.name!r} has no steps")
        names: set[str] = set()
        for step in self.steps:
            name = step.spec.name
            if name in names:
                raise ConfigurationError(f"pipeline {self.name!r} has two steps named {name!r}")
            names.add(name)
            if step.spec.awaits is not None and step.spec.effectful:
                raise ConfigurationError(f"await step {name!r} cannot be effectful")
        steps = tuple(s.spec for s in self.steps)
        return PipelineSpec(
            self.name,
            self.version,
            steps,
            self.output_topic,
            self.checkpoint,
            self.deadline_ms,
            self._graph(),
            self.emit_topics,
        )

    def _graph(self) -> Graph | None:
        """The steps as a checked graph, if any step declared graph structure."""
        if all(step.node is None for step in self.steps):
            return None
        try:
            return build_graph([step.node or Node(step.spec.name) for step in self.steps])
        except ConfigurationError as exc:
            raise ConfigurationError(f"pipeline {self.name!r}: {exc}") from exc


class Application:
    """The pipelines one deployment runs; the processor's pipeline catalog."""

    def __init__(self, pipelines: Iterable[Pipeline]) -> None:
        self._pipelines: dict[tuple[str, int], Pipeline] = {}
        self._specs: dict[tuple[str, int], PipelineSpec] = {}
        self._latest: dict[str, int] = {}
        for pipeline in pipelines:
            key = (pipeline.name, pipeline.version)
            if key in self._pipelines:
                raise ConfigurationError(
                    f"pipeline {pipeline.name!r} v{pipeline.version} defined twice"
                )
            self._pipelines[key] = pipeline
            self._specs[key] = pipeline.spec()
            self._latest[pipeline.name] = max(pipeline.version, self._latest.get(pipeline.name, 0))

    def latest(self, name: str) -> PipelineSpec | None:
        version = self._latest.get(name)
        return None if version is None else self._specs[(name, version)]

    def get(self, name: str, version: int) -> PipelineSpec | None:
        return self._specs.get((name, version))

    def pipeline(self, name: str, version: int) -> Pipeline | None:
        return self._pipelines.get((name, version))

    @property
    def names(self) -> list[str]:
        return sorted(self._latest)

    @property
    def versions(self) -> list[tuple[str, int]]:
        """(name, version) of every pipeline version loaded, sorted."""
        return sorted(self._pipelines)

    @property
    def triggers(self) -> list[tuple[str, Trigger]]:
        """(pipeline name, trigger) of each pipeline's latest version: submits start it."""
        return [
            (name, trigger)
            for name, version in sorted(self._latest.items())
            for trigger in self._pipelines[(name, version)].triggers
        ]

    @property
    def output_topics(self) -> list[str]:
        """User topics that terminal publication and emission write to."""
        emitted = {topic for s in self._specs.values() for topic in s.emit_topics}
        return sorted({s.output_topic for s in self._specs.values() if s.output_topic} | emitted)


def _graph_node(name: str, needs: Iterable[str] | None, catch: str | None = None) -> Node | None:
    """The graph node of a step declared with ``needs`` (or a handler), else None."""
    if needs is None and catch is None:
        return None
    return Node(name, None if needs is None else tuple(needs), catch=catch)


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1000)


def _no_correlation(value: Any) -> dict[str, str]:
    return {}


def _unchanged(value: Any) -> Any:
    return value


def load_application(target: str) -> Application:
    """Import ``module:attribute`` and check it is an Application.

    The working directory comes first on the import path, as with uvicorn, celery and
    flask: ``--app shop:app`` finds ``shop.py`` in the folder the command runs in
    (the ``processor`` script's own folder is what Python puts there)."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"--app must look like module:attribute, got {target!r}")
    _working_directory_on_path()
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r}: {exc}") from exc
    app = getattr(module, attribute, None)
    if not isinstance(app, Application):
        raise ConfigurationError(f"{target} is not a processor Application")
    return app


def _working_directory_on_path() -> None:
    """Put the working directory (absolute, so a child process given this ``sys.path``
    finds the same modules) first on the import path, unless it is on it already."""
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
