"""The ``processor`` command line (typer). Every command takes ``--json``.

Exit codes: 0 success, 1 error, 2 usage, 3 not found or no answer in time,
4 verification found differences.
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from pydantic import ValidationError

from processor.clients.client import (
    Client,
    CompletionReceipt,
    check_step_index,
    check_traceparent,
    status_dict,
)
from processor.config.settings import Settings
from processor.engine import heap
from processor.engine.host import Host
from processor.errors import ProcessorError, SchemaRefusedError
from processor.facts.models import CommandReply
from processor.facts.payload import InvalidPayloadError, PayloadTooLarge, dumps, loads
from processor.facts.topics import TopicName
from processor.telemetry import tracing
from processor.telemetry.logs import LOG_FORMATS, configure_logging
from processor.transport.deployment import Deployment, ensure_topics

if TYPE_CHECKING:
    from processor.examples.demo_runner import DemoReport
    from processor.facts.keyring import KeyRing
    from processor.store.rocks import PartitionStore

__all__ = ["main"]

logger = logging.getLogger("processor")

cli = typer.Typer(
    name="processor",
    help="Durable, event-sourced pipelines on Kafka (or the embedded log).",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)
topics_cli = typer.Typer(help="Topics as code: create what is missing, report drift.")
cli.add_typer(topics_cli, name="topics")
schemas_cli = typer.Typer(help="Record schemas in the Schema Registry (Confluent wire format).")
cli.add_typer(schemas_cli, name="schemas")
schedule_cli = typer.Typer(help="Schedules: start runs of a pipeline on a cron or an interval.")
cli.add_typer(schedule_cli, name="schedule")

EXIT_ERROR, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_DIFFERENT = 1, 2, 3, 4
READY_WAIT_S = 60.0  # how long ``run`` waits for its first partitions before saying ready

# The options every command shares, declared once: each is accepted before the
# command (``processor --data-dir D status X``) and after it (``status X --data-dir D``).
BrokerOption = Annotated[
    str | None,
    typer.Option("--broker", help="kafka://host:port[,host:port]; default: embedded log"),
]
DataDirOption = Annotated[
    Path | None, typer.Option("--data-dir", help="Embedded log and state directory [.processor]")
]
JSON_FLAG = "--json"
JsonFlag = Annotated[bool, typer.Option(JSON_FLAG, help="Print JSON (errors too, on stderr).")]
AppOption = Annotated[str, typer.Option("--app", help="Pipelines to load, as module:attribute.")]
WorkersOption = Annotated[int, typer.Option("--workers", min=0, help="Worker threads")]
ConcurrencyOption = Annotated[
    int | None,
    typer.Option(
        "--concurrency",
        min=1,
        help="Attempts each worker runs at once [PROCESSOR_WORKER_CONCURRENCY; 8]",
    ),
]
HttpPortOption = Annotated[
    int | None,
    typer.Option(
        "--http-port",
        min=0,
        max=65535,
        help="HTTP port [PROCESSOR_HTTP_PORT; run: 8700, worker: 8701; 0: any free port]",
    ),
]
NoHttpFlag = Annotated[
    bool, typer.Option("--no-http", help="Serve no HTTP (PROCESSOR_HTTP_ENABLED=false).")
]
_COMMON = (
    inspect.Parameter(
        "broker", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=BrokerOption
    ),
    inspect.Parameter(
        "data_dir", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=DataDirOption
    ),
    inspect.Parameter(
        "json_output", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=JsonFlag
    ),
)


@dataclass
class Invocation:
    """One command's options, and the settings, deployment and client built from them once."""

    broker: str | None = None
    data_dir: Path | None = None
    topic_prefix: str | None = None
    json_output: bool = False
    _settings: Settings | None = None
    _deployment: Deployment | None = None
    _client: Client | None = None

    def settings(self) -> Settings:
        if self._settings is None:
            overrides: dict[str, Any] = {
                name: value
                for name, value in (
                    ("broker", self.broker),
                    ("data_dir", self.data_dir),
                    ("topic_prefix", self.topic_prefix),
                )
                if value is not None
            }
            try:
                self._settings = Settings(**overrides)
            except ValidationError as exc:
                self.fail(f"invalid settings: {exc.errors()[0]['msg']}")
        return self._settings

    def deployment(self) -> Deployment:
        """The deployment (opening the embedded log creates it)."""
        if self._deployment is None:
            self._deployment = Deployment.from_settings(self.settings())
        return self._deployment

    def existing(self) -> Deployment | None:
        """The deployment if anything ever ran there (its journal exists); creates nothing."""
        settings = self.settings()
        if settings.broker is None and not settings.log_dir.exists():
            return None
        deployment = self.deployment()
        admin = deployment.transport.admin()
        try:
            topics = admin.describe_topics()
        finally:
            admin.close()
        return deployment if deployment.topology.name(TopicName.FACTS) in topics else None

    def client(self) -> Client:
        if self._client is None:
            deployment = self.deployment()
            self._client = Client(
                deployment.transport,
                deployment.topology,
                deployment.settings.state_dir,
                max_payload_bytes=deployment.settings.max_payload_bytes,
                group=deployment.settings.group,
            )
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def emit(self, value: dict[str, Any] | list[Any], text: str) -> None:
        """Print a command's answer on stdout: JSON with ``--json``, else ``text``."""
        typer.echo(json.dumps(value, default=str) if self.json_output else text)

    def fail(self, message: str, code: int = EXIT_ERROR, **details: Any) -> NoReturn:
        """Print an error on stderr and exit with ``code`` (see ``_print_error``)."""
        _print_error(message, self.json_output, **details)
        raise typer.Exit(code)

    def refuse(self, refusal: str, detail: str | None, /, **details: Any) -> NoReturn:
        """A command the processor refused: an error (exit 1) with its reason."""
        shown = {**details, "refusal": refusal, "detail": detail}
        self.fail(f"refused: {refusal}: {detail}", EXIT_ERROR, **shown)


def _json_on_command_line() -> bool:
    """Whether ``--json`` is on the command line, before or after the command: for the
    errors printed before the command's own options are read."""
    return JSON_FLAG in sys.argv[1:]


def _print_error(message: str, json_output: bool, **details: Any) -> None:
    """The one place that prints an error: on stderr, ``error: MESSAGE``, or with
    ``--json`` ``{"error": MESSAGE, **details}`` (details: what a script may need,
    such as a refusal's reason and run id)."""
    if json_output:
        typer.echo(json.dumps({"error": message, **details}, default=str), err=True)
    else:
        typer.echo(f"error: {message}", err=True)


def _with_common_options(fn: Callable[..., None]) -> Callable[..., None]:
    """Add the shared options to ``fn``'s signature (as typer reads it); pass them on
    merged into the invocation in ``ctx.obj`` (given after the command, they win)."""
    signature = inspect.signature(fn, eval_str=True)
    parameters = [*signature.parameters.values(), *_COMMON]

    @functools.wraps(fn)
    def command(ctx: typer.Context, **kwargs: Any) -> None:
        root: Invocation = ctx.obj if isinstance(ctx.obj, Invocation) else Invocation()
        broker, data_dir = kwargs.pop("broker"), kwargs.pop("data_dir")
        json_output = kwargs.pop("json_output")
        inv = Invocation(
            broker if broker is not None else root.broker,
            data_dir if data_dir is not None else root.data_dir,
            root.topic_prefix,
            json_output or root.json_output,
        )
        ctx.obj = inv
        try:
            fn(ctx, **kwargs)
        except ProcessorError as exc:
            inv.fail(str(exc))
        finally:
            inv.close()

    command.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in parameters}
    return command


def _command(
    group: typer.Typer = cli, name: str | None = None
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register a command that takes the shared options."""

    def register(fn: Callable[..., None]) -> Callable[..., None]:
        return group.command(name)(_with_common_options(fn))

    return register


def _version() -> str:
    import processor

    declared = getattr(processor, "__version__", None)
    if isinstance(declared, str):
        return declared
    try:
        return importlib.metadata.version("processor")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"processor {_version()}")
        raise typer.Exit()


@cli.callback()
def _root(
    ctx: typer.Context,
    broker: BrokerOption = None,
    data_dir: DataDirOption = None,
    json_output: JsonFlag = False,
    topic_prefix: Annotated[str | None, typer.Option(help="Prefix of every topic name")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log at INFO")] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version, exit."
        ),
    ] = False,
) -> None:
    level = logging.INFO if verbose else logging.WARNING
    _configure_telemetry(ctx, level, json_output or _json_on_command_line())
    ctx.obj = Invocation(broker, data_dir, topic_prefix, json_output)


def _configure_telemetry(ctx: typer.Context, level: int, json_output: bool) -> None:
    """Logs in ``PROCESSOR_LOG_FORMAT`` and, with ``PROCESSOR_OTEL``, spans.

    Any other invalid setting is left for the command to report, as before.
    """
    try:
        settings = Settings()
    except ValidationError as exc:
        if any(error["loc"][:1] == ("log_format",) for error in exc.errors()):
            message = f"PROCESSOR_LOG_FORMAT must be one of {', '.join(LOG_FORMATS)}"
            _print_error(message, json_output)
            raise typer.Exit(EXIT_USAGE) from None
        configure_logging("text", level)
        return
    except ProcessorError:  # e.g. both resume secrets: the command says so
        configure_logging("text", level)
        return
    configure_logging(settings.log_format, level)
    service = "processor-worker" if ctx.invoked_subcommand == "worker" else "processor"
    tracing.configure(settings.otel, service)


def _inv(ctx: typer.Context) -> Invocation:
    invocation: Invocation = ctx.obj
    return invocation


def _load_app(inv: Invocation, target: str) -> Any:
    from processor.worker.pipeline import load_application

    try:
        return load_application(target)
    except ProcessorError as exc:
        inv.fail(str(exc))


def _stop_on_signals(stop: threading.Event) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())


def _http_wanted(inv: Invocation, no_http: bool) -> bool:
    """Whether to serve HTTP; without it nothing can scrape metrics: record none."""
    from processor.telemetry.metrics import set_recording

    wanted = not no_http and inv.settings().http_enabled
    set_recording(wanted)
    return wanted


def _serving(address: str) -> None:
    typer.echo(f"http: serving on {address}", err=True)


def _wait_assigned(host: Host, timeout_s: float) -> list[int]:
    """The partitions the processor owns once it has been assigned some (or at the timeout)."""
    deadline = time.monotonic() + timeout_s
    while not host.stop_event.wait(0.05):
        owned = host.loop.owned_partitions if host.loop is not None else []
        if owned or time.monotonic() >= deadline:
            return owned
    return []


@_command()
def run(
    ctx: typer.Context,
    app: AppOption,
    workers: WorkersOption = 2,
    concurrency: ConcurrencyOption = None,
    http_port: HttpPortOption = None,
    no_http: NoHttpFlag = False,
) -> None:
    """Run the processor (and in-process workers) until interrupted.

    Serves metrics, health, the JSON API and the inspector page over HTTP
    (README, "HTTP API and metrics") unless --no-http."""
    inv = _inv(ctx)
    pipelines = _load_app(inv, app)
    deployment = inv.deployment()
    serve_http = _http_wanted(inv, no_http)  # before the workers start: they record or not
    host = Host(deployment, pipelines, workers=workers, concurrency=concurrency, app_ref=app)
    _stop_on_signals(host.stop_event)
    host.start()
    if host.durability is not None:
        typer.echo(host.durability.describe(), err=True)
    typer.echo(f"processor {host.instance_id} running ({workers} workers); Ctrl-C stops", err=True)
    web = None
    if serve_http:
        from processor.web.wiring import ProcessorWeb  # FastAPI costs other commands' start

        web = ProcessorWeb(host, port=http_port)
        try:
            _serving(web.start())
        except ProcessorError:
            host.stop()
            raise
    heap.settle()  # started: what is allocated so far stays for the process's life
    try:
        _run_until_stopped(inv, host, workers, web.address if web is not None else None)
    finally:
        if web is not None:
            web.stop()
    host.stop()
    if host.errors:
        inv.fail(f"stopped after an error: {host.errors[0]!r}")


def _run_until_stopped(inv: Invocation, host: Host, workers: int, http: str | None) -> None:
    """Say ready once partitions are assigned, then wait until stopped."""
    deployment = host.deployment
    partitions = _wait_assigned(host, READY_WAIT_S)
    host.workers_ready(READY_WAIT_S)
    if not host.stop_event.is_set():
        broker = deployment.settings.broker or f"embedded:{deployment.settings.log_dir}"
        ready = {
            "ready": True,
            "instance_id": host.instance_id,
            "broker": broker,
            "partitions": partitions,
            "workers": workers,
        }
        if http is not None:
            ready["http"] = http
        inv.emit(ready, f"ready: {host.instance_id} on {broker}, partitions {partitions}")
    host.wait()


@_command()
def check(ctx: typer.Context, app: AppOption) -> None:
    """Check an application's definitions without running it: what ``run`` and
    ``worker`` would refuse, and each pipeline version's steps and segments."""
    from processor.worker.outline import outline, outline_text

    inv = _inv(ctx)
    shown = outline(_load_app(inv, app))
    checked = f"{len(shown)} pipeline version{'s' if len(shown) != 1 else ''}"
    text = outline_text(shown) + f"\nok: {checked} checked"
    inv.emit({"ok": True, "pipelines": shown}, text)


@_command()
def worker(
    ctx: typer.Context,
    app: AppOption,
    workers: WorkersOption = 1,
    concurrency: ConcurrencyOption = None,
    threads: Annotated[
        int | None, typer.Option("--threads", hidden=True, help="Deprecated: --workers")
    ] = None,
    http_port: HttpPortOption = None,
    no_http: NoHttpFlag = False,
) -> None:
    """Run workers only: consume segments.work, run steps, produce results.

    Serves /healthz, /readyz and /metrics over HTTP unless --no-http."""
    from processor.worker.joining import JoinGate
    from processor.worker.service import Worker

    inv = _inv(ctx)
    if threads is not None:
        typer.echo("warning: --threads is deprecated; use --workers", err=True)
        workers = threads
    if workers < 1:
        inv.fail("processor worker needs --workers 1 or more", EXIT_USAGE)
    pipelines = _load_app(inv, app)
    deployment = inv.deployment()
    stop = threading.Event()
    _stop_on_signals(stop)
    gate = JoinGate(workers)
    runners = [
        Worker.from_settings(deployment, pipelines, concurrency=concurrency, gate=gate)
        for _ in range(workers)
    ]
    pool = [threading.Thread(target=w.run, args=(stop,), daemon=True) for w in runners]
    web = None
    if _http_wanted(inv, no_http):
        from processor.web.wiring import WorkerWeb

        web = WorkerWeb(inv.settings(), port=http_port)
        _serving(web.start())
    for thread in pool:
        thread.start()
    # Ready once the processors can know of it (every worker has announced itself) and
    # its workers take work (all have joined their group: ``worker.joining``).
    deadline = time.monotonic() + READY_WAIT_S
    for runner in runners:
        runner.announcer.announced.wait(max(0.0, deadline - time.monotonic()))
    gate.opened.wait(max(0.0, deadline - time.monotonic()))
    slots = runners[0].concurrency
    inv.emit(
        {"ready": True, "workers": workers, "concurrency": slots},
        f"ready: {workers} workers, {slots} attempts at once each",
    )
    try:
        while any(t.is_alive() for t in pool) and not stop.wait(0.5):
            pass
    finally:
        stop.set()
        for thread in pool:
            thread.join(30)
        if web is not None:
            web.stop()


@_command()
def submit(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="Pipeline name")],
    input_json: Annotated[str, typer.Option("--input", help="Run input as JSON")],
    idempotency_key: Annotated[str | None, typer.Option(help="Deduplicate retries")] = None,
    deadline_s: Annotated[
        float | None, typer.Option(help="Run deadline, seconds from now (overrides the pipeline's)")
    ] = None,
    wait: Annotated[float, typer.Option(help="Seconds to wait for the processor")] = 30.0,
    traceparent: Annotated[
        str | None, typer.Option(help="W3C traceparent of the caller's trace, for the run")
    ] = None,
) -> None:
    """Submit a run; print its id and whether this call created it."""
    inv = _inv(ctx)
    try:
        value = loads(input_json.encode())
        check_traceparent(traceparent)
    except InvalidPayloadError as exc:
        inv.fail(f"--input: {exc}", code=EXIT_USAGE)
    except ValueError as exc:
        inv.fail(f"--traceparent: {exc}", code=EXIT_USAGE)
    ensure_topics(inv.deployment())
    try:
        receipt = inv.client().submit(
            pipeline,
            value,
            idempotency_key,
            deadline_s=deadline_s,
            wait_s=wait,
            traceparent=traceparent,
        )
    except PayloadTooLarge as exc:  # refused before anything was produced
        inv.fail(f"--input: payload_too_large: {exc}", code=EXIT_USAGE)
    except ValueError as exc:  # a deadline no command can carry; nothing was produced
        inv.fail(f"--deadline-s: {exc}", code=EXIT_USAGE)
    shown = receipt.as_dict()
    if receipt.refusal:
        inv.refuse(receipt.refusal, receipt.detail, **shown)
    if receipt.created is None:
        message = f"no processor answered in {wait}s; run {receipt.run_id} is queued"
        inv.fail(message, EXIT_NOT_FOUND, **shown)
    inv.emit(shown, f"{receipt.run_id} {'created' if receipt.created else 'existing'}")


def _existing_or_no_run(inv: Invocation, run_id: str) -> Deployment:
    """The deployment, or 'no run X' (exit 3) where nothing has run: nothing is created."""
    deployment = inv.existing()
    if deployment is None:
        inv.fail(f"no run {run_id}", code=EXIT_NOT_FOUND)
    return deployment


@_command()
def status(ctx: typer.Context, run_id: Annotated[str, typer.Argument(help="Run id")]) -> None:
    """Show a run's status, result and error (as of the end of runs.facts)."""
    inv = _inv(ctx)
    _existing_or_no_run(inv, run_id)
    state = inv.client().current(run_id).state
    if state is None:
        inv.fail(f"no run {run_id}", code=EXIT_NOT_FOUND)
    shown = status_dict(state)
    lines = "\n".join(
        f"{k}: {json.dumps(v) if isinstance(v, dict | list) else v}" for k, v in shown.items()
    )
    inv.emit(shown, lines)


@_command()
def history(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="Run id")],
    after: Annotated[
        int | None, typer.Option(min=0, help="Only facts after this seq (a page's next_after)")
    ] = None,
    limit: Annotated[
        int | None, typer.Option(min=1, max=1000, help="Facts per page (at most 1,000)")
    ] = None,
) -> None:
    """Show a run's facts in order (up to the end of runs.facts), a page of 1,000 at most.

    With --after or --limit, --json prints the page: ``{"run_id", "facts", "next_after"}``;
    without them it prints the first page's facts as a list."""
    from processor.clients.pages import MAX_PAGE, history_page

    inv = _inv(ctx)
    _existing_or_no_run(inv, run_id)
    facts = inv.client().current(run_id).history
    if not facts:
        inv.fail(f"no run {run_id}", code=EXIT_NOT_FOUND)
    page = history_page(facts, after or 0, limit or MAX_PAGE)
    rows = page.facts
    text = "\n".join(f"{r['seq']:>4} {r['type']:<24} {r['fact_key']}" for r in rows)
    more = _next_page_hint("--after", page.next_after)
    if after is None and limit is None:  # today's output, capped at one page
        inv.emit(rows, text)
        if more:
            typer.echo(more, err=True)
        return
    shown = {"run_id": run_id, **page.as_dict()}
    inv.emit(shown, "\n".join(filter(None, (text, more))))


def _next_page_hint(option: str, value: object) -> str:
    """The line that says how to read the next page ('' on the last one)."""
    return "" if value is None else f"next page: {option} {value}"


_SINCE_HELP = (
    "epoch ms, an ISO-8601 time (UTC without an offset) or a duration back from now "
    "(90s, 10m, 2h, 1d)"
)


@_command()
def runs(
    ctx: typer.Context,
    status_: Annotated[
        str | None,
        typer.Option("--status", help="running, succeeded, failed, cancelled or timed_out"),
    ] = None,
    pipeline: Annotated[str | None, typer.Option(help="Only runs of this pipeline")] = None,
    since: Annotated[str | None, typer.Option(help=f"Submitted at or after: {_SINCE_HELP}")] = None,
    until: Annotated[str | None, typer.Option(help=f"Submitted before: {_SINCE_HELP}")] = None,
    target: Annotated[
        str | None, typer.Option(help="Only runs waiting at a boundary on this target")
    ] = None,
    limit: Annotated[int, typer.Option(help="Runs per page, 1 to 1000")] = 50,
    cursor: Annotated[
        str | None, typer.Option(help="Go on after a page: the cursor it printed")
    ] = None,
) -> None:
    """List runs from the local stores' runs index, newest submitted first, a page at a time."""
    from processor.clients.moments import parse_moment
    from processor.store.listing import RunQuery, list_runs
    from processor.store.readers import store_partitions

    inv = _inv(ctx)
    now_ms = int(time.time() * 1000)
    try:
        query = RunQuery(
            status=status_,
            pipeline=pipeline,
            since_ms=None if since is None else parse_moment(since, now_ms),
            until_ms=None if until is None else parse_moment(until, now_ms),
            target=target,
        )
        with _owned_stores(inv) as stores:
            page = list_runs(stores, query, cursor, limit)
            partitions = store_partitions(stores)
    except ValueError as exc:
        inv.fail(str(exc), code=EXIT_USAGE)
    shown = [run.as_dict() for run in page.runs]
    lines = [
        f"{r['run_id']}  {r['pipeline']:<16} {r['status']:<10} {r['phase']:<10} "
        f"{_iso(r['submitted_ms'])}  {','.join(r['waiting_on']) or '-'}"
        for r in shown
    ]
    if page.next_cursor is not None:
        lines.append(f"next page: --cursor {page.next_cursor}")
    listed = {"runs": shown, "next_cursor": page.next_cursor, "partitions": partitions}
    inv.emit(listed, "\n".join(lines) or "no runs")


@contextmanager
def _owned_stores(inv: Invocation) -> Iterator[list[PartitionStore]]:
    """Readers of the local stores of the partitions the processor here owns, for the
    block; says on stderr when that is not every partition (README, "Listing runs")."""
    from processor.store.ownership import listable, listing_note, owned_here
    from processor.store.readers import open_readers

    settings = inv.settings()
    owner, embedded = owned_here(settings.state_dir), settings.broker is None
    note = listing_note(owner, embedded=embedded, state_dir=settings.state_dir)
    if note is not None:
        typer.echo(f"note: {note}", err=True)
    stores = open_readers(settings.state_dir, listable(owner, embedded=embedded))
    try:
        yield stores
    finally:
        for store in stores:
            store.close()


def _iso(epoch_ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_ms / 1000))


@_command()
def replay(
    ctx: typer.Context,
    verify: Annotated[bool, typer.Option(help="Compare with the live projections")] = False,
    target: Annotated[Path | None, typer.Option(help="Keep the rebuilt stores here")] = None,
    processes: Annotated[
        int | None,
        typer.Option(
            min=1, help="Processes rebuilding partitions [default: one per CPU for big replays]"
        ),
    ] = None,
) -> None:
    """Rebuild projections from runs.facts into a fresh store (with --verify: compare)."""
    from tqdm import tqdm

    from processor.restore.replay import replay as run_replay

    inv = _inv(ctx)
    deployment = inv.existing()
    if deployment is None:
        where = inv.settings().broker or inv.settings().data_dir
        inv.fail(f"no runs.facts at {where}: nothing to replay", code=EXIT_NOT_FOUND)
    bars: list[tqdm[Any]] = []

    def progress(total: int) -> Any:
        bar = tqdm(total=total, unit="fact", disable=inv.json_output, file=sys.stderr)
        bars.append(bar)
        return bar.update

    report = run_replay(
        deployment.transport,
        deployment.topology,
        deployment.settings.state_dir,
        verify=verify,
        target_dir=target,
        progress_total=progress,
        processes=processes,
        native_fold=deployment.settings.native_fold,
    )
    for bar in bars:
        bar.close()
    if verify and report.facts == 0:
        inv.fail("runs.facts holds no facts: nothing to verify", code=EXIT_NOT_FOUND)
    text = f"replayed {report.facts} facts of {report.runs} runs in {report.seconds:.2f}s"
    if verify:
        text += (
            "; verified" if report.verified else "; DIFFERENCES:\n" + "\n".join(report.differences)
        )
    inv.emit(report.as_dict(), text)
    if verify and not report.verified:
        inv.fail(f"replay --verify found {len(report.differences)} differences", EXIT_DIFFERENT)


@_command()
def demo(
    ctx: typer.Context,
    runs: Annotated[int, typer.Option(help="Runs to submit")] = 1000,
    workers: WorkersOption = 2,
) -> None:
    """Run the bundled order pipeline end to end, then replay and verify."""
    from processor.examples.demo import app as demo_app
    from processor.examples.demo import payments_simulator
    from processor.examples.demo_runner import run_demo

    inv = _inv(ctx)
    try:
        report = run_demo(
            inv.settings(),
            demo_app,
            runs,
            workers,
            handlers={"payments": payments_simulator},
            app_ref="processor.examples.demo:app",
        )
    except TimeoutError as exc:
        inv.fail(str(exc))
    shown = report.as_dict()
    inv.emit(shown, "\n".join(f"{k:>16}: {v}" for k, v in shown.items()))
    problems = _demo_problems(report)
    if problems:
        inv.fail(f"the demo did not pass: {', '.join(problems)}", EXIT_DIFFERENT)


def _demo_problems(report: DemoReport) -> list[str]:
    """What makes a demo fail, in words: runs that did not end, a replay that differs."""
    problems = []
    ended = report.succeeded + report.failed
    if ended != report.submitted:
        problems.append(f"{ended} of {report.submitted} runs ended")
    if not report.replay_verified:
        problems.append("replay verification failed")
    return problems


def _reply_or_exit(inv: Invocation, reply: CommandReply | None, wait: float) -> dict[str, Any]:
    if reply is None:
        inv.fail(f"no processor answered in {wait}s (the command is queued)", EXIT_NOT_FOUND)
    if reply.refusal:
        inv.refuse(reply.refusal, reply.detail, run_id=reply.run_id)
    response = json.loads(reply.response) if reply.response else {}
    return {"run_id": reply.run_id, "accepted": reply.created, "detail": reply.detail, **response}


@_command()
def cancel(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="Run id")],
    reason: Annotated[str, typer.Option(help="Why, kept in the stop intent")] = "",
    wait: Annotated[float, typer.Option(help="Seconds to wait for the processor")] = 30.0,
) -> None:
    """Cancel a run: stop intent, then the running attempt settles and steps are compensated."""
    inv = _inv(ctx)
    _existing_or_no_run(inv, run_id)
    shown = _reply_or_exit(inv, inv.client().cancel(run_id, reason, wait_s=wait), wait)
    inv.emit(shown, f"{run_id}: " + ("cancelling" if shown["accepted"] else str(shown["detail"])))


@_command()
def resolve(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="Run id")],
    segment: Annotated[int, typer.Option(help="Segment (or compensated step) of the attempt")],
    attempt: Annotated[int, typer.Option(help="Attempt ordinal")],
    generation: Annotated[int, typer.Option(help="Fencing generation of the Unknown attempt")],
    idempotency_key: Annotated[
        str, typer.Option(help="Your key; a repeat returns the same response")
    ],
    succeed: Annotated[
        str | None, typer.Option(help="Supplied success: the output as JSON")
    ] = None,
    fail: Annotated[str | None, typer.Option(help="Declared failure: the error")] = None,
    retry: Annotated[bool, typer.Option("--retry", help="Explicit retry: new generation")] = False,
    compensation: Annotated[
        bool, typer.Option("--compensation", help="The attempt is a compensator's")
    ] = False,
    wait: Annotated[float, typer.Option(help="Seconds to wait for the processor")] = 30.0,
) -> None:
    """Resolve an Unknown attempt with exactly one of --succeed, --fail, --retry.

    A repeat with the same key prints the recorded response again, with
    ``"replayed": true`` (and ``accepted: false``: this call changed nothing)."""
    inv = _inv(ctx)
    if sum(x is not None and x is not False for x in (succeed, fail, retry)) != 1:
        inv.fail("give exactly one of --succeed, --fail and --retry", code=EXIT_USAGE)
    output = None
    if succeed is not None:
        try:
            output = loads(succeed.encode())
        except InvalidPayloadError as exc:
            inv.fail(f"--succeed: {exc}", code=EXIT_USAGE)
    action = "succeed" if succeed is not None else "fail" if fail is not None else "retry"
    reply = inv.client().resolve(
        run_id,
        segment=segment,
        attempt=attempt,
        generation=generation,
        idempotency_key=idempotency_key,
        action=action,
        output=output,
        error=fail,
        kind="compensate" if compensation else "forward",
        wait_s=wait,
    )
    shown = _reply_or_exit(inv, reply, wait)
    # Not created and not refused: the key's recorded response, replayed.
    shown["replayed"] = not shown["accepted"]
    text = (
        f"{run_id}: {action} accepted"
        if shown["accepted"]
        else f"{run_id}: replayed the recorded response ({shown['detail']}); nothing changed"
    )
    inv.emit(shown, text)


@_command()
def redrive(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="Run id of a failed run")],
    from_step: Annotated[
        int | None,
        typer.Option(help="Step index to run again from (0 .. the failed step; default: it)"),
    ] = None,
    reason: Annotated[str, typer.Option(help="Why, kept in the RunRedriven fact")] = "",
    operator: Annotated[str, typer.Option(help="Who, kept in the RunRedriven fact")] = "",
    command_id: Annotated[
        str | None, typer.Option(help="Your command id; the same id again redrives once")
    ] = None,
    wait: Annotated[float, typer.Option(help="Seconds to wait for the processor")] = 30.0,
) -> None:
    """Redrive a failed run: a new attempt of its failed step, or from --from-step.

    Refused (exit 1, with the reason: not_failed, compensated, deadline_elapsed,
    bad_step, unknown_run) for a run that cannot be redriven."""
    inv = _inv(ctx)
    try:
        check_step_index(from_step)
    except ValueError as exc:
        inv.fail(f"--from-step: {exc}", code=EXIT_USAGE)
    _existing_or_no_run(inv, run_id)
    reply = inv.client().redrive(
        run_id, from_step, operator=operator, reason=reason, command_id=command_id, wait_s=wait
    )
    shown = _reply_or_exit(inv, reply, wait)
    shown["replayed"] = not shown["accepted"]  # the command id was applied before
    text = f"{run_id}: redriven from step {shown.get('from_step')}" + (
        "" if shown["accepted"] else " (already applied; nothing changed)"
    )
    inv.emit(shown, text)


@_command()
def release(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="Run id of a quarantined run")],
    reason: Annotated[str, typer.Option(help="Why, kept in the RunReleased fact")] = "",
    operator: Annotated[str, typer.Option(help="Who, kept in the RunReleased fact")] = "",
    wait: Annotated[float, typer.Option(help="Seconds to wait for the processor")] = 30.0,
) -> None:
    """Release a quarantined run (a decision about it raised): its timers fire again.

    Deploy the fix first. Refused (exit 1, with the reason: not_quarantined,
    unknown_run) for a run that is not quarantined."""
    inv = _inv(ctx)
    _existing_or_no_run(inv, run_id)
    reply = inv.client().release(run_id, operator=operator, reason=reason, wait_s=wait)
    shown = _reply_or_exit(inv, reply, wait)
    inv.emit(shown, f"{run_id}: released (quarantined by {shown.get('source')})")


@_command()
def complete(
    ctx: typer.Context,
    token: Annotated[str, typer.Argument(help="Resume token from the boundary request")],
    payload_json: Annotated[
        str | None, typer.Option("--payload", help="Completion payload as JSON")
    ] = None,
    fail: Annotated[str | None, typer.Option(help="Report a failure with this error")] = None,
    idempotency_key: Annotated[str | None, typer.Option(help="Sender's key")] = None,
    wait: Annotated[
        float,
        typer.Option(min=0, help="Seconds to wait for the admission decision [0: do not wait]"),
    ] = 0.0,
) -> None:
    """Complete (or --fail) an await interaction, as an external system does; with
    --wait, say whether it was admitted, a duplicate, or refused (and why)."""
    from processor.facts import tokens

    inv = _inv(ctx)
    if (payload_json is None) == (fail is None):
        inv.fail("give exactly one of --payload and --fail", code=EXIT_USAGE)
    if tokens.parse(token) is None:
        inv.fail("not a resume token", code=EXIT_USAGE)
    body = b""
    if payload_json is not None:
        try:
            body = dumps(loads(payload_json.encode()))
        except InvalidPayloadError as exc:
            inv.fail(f"--payload: {exc}", code=EXIT_USAGE)
    outcome = "failure" if fail is not None else "success"
    ensure_topics(inv.deployment())  # as submit: the first client may be the first writer
    try:
        receipt = inv.client().answer(
            token, outcome, body, fail, idempotency_key=idempotency_key, wait_s=wait
        )
    except PayloadTooLarge as exc:  # refused before anything was produced
        inv.fail(f"--payload: payload_too_large: {exc}", code=EXIT_USAGE)
    _show_receipt(inv, receipt, wait)


@_command(name="signal")
def send_signal(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The event name a wait names (await_event)")],
    run: Annotated[str | None, typer.Option(help="The run the event is for")] = None,
    key: Annotated[
        str | None, typer.Option(help="A correlation key: every run waiting on it gets it")
    ] = None,
    payload_json: Annotated[str, typer.Option("--payload", help="Event payload as JSON")] = "null",
    correlation: Annotated[
        list[str] | None, typer.Option("--field", help="A correlation field, FIELD=VALUE")
    ] = None,
    event_id: Annotated[
        str | None, typer.Option(help="The event's id: the same id twice is admitted once")
    ] = None,
) -> None:
    """Send a named event to a run (--run) or to every run waiting on a correlation key
    (--key); the processor admits it or keeps it in admission.rejected with a reason."""
    inv = _inv(ctx)
    if (run is None) == (key is None):
        inv.fail("give exactly one of --run and --key", code=EXIT_USAGE)
    fields: dict[str, str] = {}
    for pair in correlation or []:
        field, sep, value = pair.partition("=")
        if not sep or not field:
            inv.fail(f"--field: FIELD=VALUE, got {pair!r}", code=EXIT_USAGE)
        fields[field] = value
    try:
        value = loads(payload_json.encode())
    except InvalidPayloadError as exc:
        inv.fail(f"--payload: {exc}", code=EXIT_USAGE)
    ensure_topics(inv.deployment())
    try:
        sent = inv.client().signal(
            name, value, run_id=run, key=key, correlation=fields, event_id=event_id
        )
    except ValueError as exc:  # a bad address, or over the payload limit: nothing produced
        inv.fail(str(exc), code=EXIT_USAGE)
    where = f"run {run}" if run is not None else f"key {key}"
    inv.emit(sent.as_dict(), f"sent {name} ({sent.event_id}) to {where}")


def _show_receipt(inv: Invocation, receipt: CompletionReceipt, wait: float) -> None:
    """What became of a completion: on stdout, or an error when refused or unanswered."""
    shown = receipt.as_dict()
    if receipt.refusal is not None:
        inv.refuse(receipt.refusal, receipt.detail, **shown)
    if receipt.queued and wait > 0:
        message = f"no processor answered in {wait}s; the completion is queued"
        inv.fail(message, EXIT_NOT_FOUND, **shown)
    text = f"{receipt.admission}: {receipt.outcome} for {receipt.interaction} of {receipt.run_id}"
    if receipt.admission == "duplicate":
        text += " (the same answer was admitted before: nothing changed)"
    inv.emit(shown, text)


PAGE_SIZE = 100  # the default page of ``rejected`` and ``dlq``
CursorOption = Annotated[
    str | None, typer.Option("--cursor", help="Where to go on: a page's next_cursor")
]
PageLimitOption = Annotated[
    int | None, typer.Option("--limit", min=1, max=1000, help="Records per page [100]")
]


def _topic_page(
    inv: Invocation, topic: TopicName, cursor: str | None, limit: int | None
) -> tuple[list[dict[str, Any]], str | None]:
    """One page of ``topic`` (nothing where nothing has run); a bad cursor exits 2."""
    from processor.clients.pages import CursorError, read_topic_page

    deployment = inv.existing()  # where nothing has run, the topic holds nothing
    if deployment is None:
        return [], None
    try:
        page = read_topic_page(
            deployment.transport,
            deployment.topology.name(topic),
            cursor,
            limit or PAGE_SIZE,
        )
    except CursorError as exc:
        inv.fail(f"--{exc}", code=EXIT_USAGE)
    return page.records, page.next_cursor


def _emit_page(
    inv: Invocation,
    rows: list[dict[str, Any]],
    next_cursor: str | None,
    text: str,
    paged: bool,
) -> None:
    """A page: its records as a list (as before paging existed) or, asked for a page
    (--cursor, --limit), ``{"records", "next_cursor"}``; the next page's command last."""
    more = _next_page_hint("--cursor", next_cursor)
    if paged:
        inv.emit(
            {"records": rows, "next_cursor": next_cursor}, "\n".join(filter(None, (text, more)))
        )
        return
    inv.emit(rows, text)
    if more:
        typer.echo(more, err=True)


@_command()
def rejected(
    ctx: typer.Context,
    cursor: CursorOption = None,
    limit: PageLimitOption = None,
    reason: Annotated[str | None, typer.Option(help="Only this reason (of the page read)")] = None,
) -> None:
    """List refused input kept in admission.rejected, a page at a time: reason, source,
    time, run id. Partition by partition, oldest first; never reads the whole topic."""
    inv = _inv(ctx)
    found, next_cursor = _topic_page(inv, TopicName.REJECTED, cursor, limit)
    rows = [r for r in found if reason in (None, r["reason"])]
    text = "\n".join(
        f"{r['time']}  {r['reason']:<22} {r['source']:<40} run={r['run_id'] or '-'}  {r['detail']}"
        for r in rows
    )
    paged = cursor is not None or limit is not None
    _emit_page(inv, rows, next_cursor, text or "no rejected input", paged)


@_command()
def dlq(ctx: typer.Context, cursor: CursorOption = None, limit: PageLimitOption = None) -> None:
    """List the dead letters of runs.dlq (runs that failed for good), a page at a time."""
    inv = _inv(ctx)
    rows, next_cursor = _topic_page(inv, TopicName.DLQ, cursor, limit)
    text = "\n".join(
        f"{r.get('time', '-')}  {r['run_id'] or '-'}  {r.get('pipeline', '-')} "
        f"step={r.get('step', '-')} attempts={r.get('attempts', '-')}  {r['error']}"
        for r in rows
    )
    paged = cursor is not None or limit is not None
    _emit_page(inv, rows, next_cursor, text or "no dead letters", paged)


@_command()
def requests(
    ctx: typer.Context,
    run: Annotated[str | None, typer.Option("--run", help="Only this run's")] = None,
    target: Annotated[str | None, typer.Option(help="Only requests to this target")] = None,
) -> None:
    """List pending requests (open interactions of waiting runs) with their resume tokens.

    Reads the local stores: run it where ``processor run`` runs. A token goes to
    ``processor complete``."""
    from processor.clients.pages import pending_requests

    inv = _inv(ctx)
    deployment = inv.existing()
    if deployment is None:
        inv.emit([], "no pending requests")
        return
    with _owned_stores(inv) as stores:
        found = pending_requests(stores, _resume_key_ring(inv), run, target)
    rows = [r.as_dict() for r in found]
    text = "\n".join(
        f"{r['run_id']}  boundary={r['boundary']} item={r['item_index']} {r['kind']} "
        f"target={r['target']} deadline_ms={r['deadline_ms']}\n  token: {r['token']}"
        for r in rows
    )
    inv.emit(rows, text or "no pending requests")


def _resume_key_ring(inv: Invocation) -> KeyRing:
    from processor.config.resume_secret import resume_keys
    from processor.facts.keyring import KeyRing

    return KeyRing(resume_keys(inv.settings()))


@_command(topics_cli, "apply")
def topics_apply(ctx: typer.Context) -> None:
    """Create missing topics and report drift from topics/topics.toml."""
    inv = _inv(ctx)
    deployment = inv.deployment()
    created = ensure_topics(deployment)
    admin = deployment.transport.admin()
    try:
        drift = deployment.topology.drift(admin.describe_topics())
    finally:
        admin.close()
    shown = {"created": created, "drift": [{"topic": d.topic, "problem": d.problem} for d in drift]}
    text = "\n".join(
        [*(f"created {n}" for n in created), *(f"drift {d.topic}: {d.problem}" for d in drift)]
    )
    inv.emit(shown, text or "topics up to date")
    if drift:
        differ = ", ".join(sorted({d.topic for d in drift}))
        inv.fail(f"topics differ from their declarations: {differ}", EXIT_DIFFERENT)


@_command(schemas_cli, "apply")
def schemas_apply(ctx: typer.Context) -> None:
    """Register every topic's schemas with BACKWARD compatibility (needs a registry)."""
    # Imported here: the registry client's HTTP stack costs every other command ~0.4 s.
    from processor.clients.schemas import apply_schemas

    inv = _inv(ctx)
    try:
        applied = apply_schemas(inv.settings())
    except SchemaRefusedError as exc:
        inv.fail(str(exc))
    shown = [
        {"subject": a.subject, "id": a.schema_id, "compatibility": a.compatibility} for a in applied
    ]
    text = "\n".join(f"{a.subject}: id {a.schema_id} ({a.compatibility})" for a in applied)
    inv.emit(shown, text)


# --- schedules (processor/clients/schedules.py) -------------------------------------------

ScheduleIdArgument = Annotated[str, typer.Argument(help="Schedule id")]
WaitOption = Annotated[float, typer.Option(help="Seconds to wait for the processor")]


@_command(schedule_cli, "create")
def schedule_create(
    ctx: typer.Context,
    schedule_id: ScheduleIdArgument,
    pipeline: Annotated[str, typer.Option(help="Pipeline the schedule starts")],
    input_json: Annotated[str, typer.Option("--input", help="Run input as JSON")] = "null",
    cron: Annotated[str | None, typer.Option(help="Cron expression (5 or 6 fields)")] = None,
    every_s: Annotated[float | None, typer.Option("--every", help="Interval, seconds")] = None,
    timezone: Annotated[str, typer.Option("--tz", help="IANA time zone of --cron")] = "UTC",
    catch_up: Annotated[str, typer.Option(help="After downtime: skip, last or all")] = "skip",
    catch_up_limit: Annotated[int, typer.Option(help="Most missed fires --catch-up all runs")] = 10,
    overlap: Annotated[str, typer.Option(help="While the last run runs: skip, queue, allow")] = (
        "allow"
    ),
    jitter_s: Annotated[float, typer.Option("--jitter", help="Largest delay, seconds")] = 0.0,
    wait: WaitOption = 30.0,
) -> None:
    """Create a schedule; refused with a reason if malformed or its pipeline is unknown."""
    from processor.clients.schedules import ScheduleError

    inv = _inv(ctx)
    try:
        value = loads(input_json.encode())
    except InvalidPayloadError as exc:
        inv.fail(f"--input: {exc}", code=EXIT_USAGE)
    ensure_topics(inv.deployment())
    try:
        receipt = inv.client().schedules.create(
            schedule_id,
            pipeline,
            value,
            cron=cron,
            interval_s=every_s,
            timezone=timezone,
            catch_up=catch_up,
            catch_up_limit=catch_up_limit,
            overlap=overlap,
            jitter_s=jitter_s,
            wait_s=wait,
        )
    except ScheduleError as exc:
        inv.fail(str(exc), EXIT_USAGE, refusal=exc.reason, detail=exc.detail)
    _schedule_answer(inv, receipt, wait, "created")


def _schedule_answer(inv: Invocation, receipt: Any, wait: float, done: str) -> None:
    shown = receipt.as_dict()
    if receipt.refusal:
        inv.refuse(receipt.refusal, receipt.detail, **shown)
    if receipt.changed is None:
        inv.fail(f"no processor answered in {wait}s", EXIT_NOT_FOUND, **shown)
    inv.emit(shown, f"{receipt.schedule_id} {done if receipt.changed else 'unchanged'}")


def _schedule_action(ctx: typer.Context, schedule_id: str, action: str, wait: float) -> None:
    from processor.clients.schedules import ScheduleError

    inv = _inv(ctx)
    ensure_topics(inv.deployment())
    schedules = inv.client().schedules
    try:
        receipt = getattr(schedules, action)(schedule_id, wait_s=wait)
    except ScheduleError as exc:
        inv.fail(str(exc), EXIT_USAGE, refusal=exc.reason, detail=exc.detail)
    _schedule_answer(inv, receipt, wait, _DONE[action])


_DONE = {"pause": "paused", "resume": "resumed", "delete": "deleted"}


def _schedule_line(shown: dict[str, Any]) -> str:
    """One schedule as a line: id, pipeline, when, state, last and next fire."""
    when = shown["cron"] or f"every {shown['interval_s']}s"
    state = "paused" if shown["paused"] else f"next {_moment(shown['next_fire_ms'])}"
    last = _moment(shown["last_fire_ms"])
    named = f"{shown['schedule_id']} {shown['pipeline']}"
    return f"{named} {when} ({shown['timezone']}) {state}, last {last}"


def _moment(epoch_ms: int | None) -> str:
    if epoch_ms is None:
        return "-"
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="seconds")


@_command(schedule_cli, "pause")
def schedule_pause(
    ctx: typer.Context, schedule_id: ScheduleIdArgument, wait: WaitOption = 30.0
) -> None:
    """Pause a schedule: nothing fires until it is resumed."""
    _schedule_action(ctx, schedule_id, "pause", wait)


@_command(schedule_cli, "resume")
def schedule_resume(
    ctx: typer.Context, schedule_id: ScheduleIdArgument, wait: WaitOption = 30.0
) -> None:
    """Resume a schedule from the next fire time after now."""
    _schedule_action(ctx, schedule_id, "resume", wait)


@_command(schedule_cli, "delete")
def schedule_delete(
    ctx: typer.Context, schedule_id: ScheduleIdArgument, wait: WaitOption = 30.0
) -> None:
    """Delete a schedule (the runs it started stay)."""
    _schedule_action(ctx, schedule_id, "delete", wait)


@_command(schedule_cli, "list")
def schedule_list(ctx: typer.Context) -> None:
    """List the schedules: next fire, last fire and run, paused."""
    inv = _inv(ctx)
    ensure_topics(inv.deployment())
    listed = inv.client().schedules.list()
    lines = [_schedule_line(s) for s in listed]
    inv.emit(listed, "\n".join(lines) or "no schedules")


def main() -> None:
    """The ``processor`` entry point.

    With ``--json``, a usage error is JSON on stderr too; without, click words it."""
    json_output = _json_on_command_line()
    try:
        code = cli(standalone_mode=not json_output)
    except typer.TyperException as exc:  # raised only outside standalone mode: with --json
        _print_error(exc.format_message(), json_output)
        sys.exit(exc.exit_code)
    except typer.Abort:
        _print_error("aborted", json_output)
        sys.exit(EXIT_ERROR)
    except ProcessorError as exc:  # raised outside a command (its own are caught there)
        _print_error(str(exc), json_output)
        sys.exit(EXIT_ERROR)
    sys.exit(code if isinstance(code, int) else 0)
