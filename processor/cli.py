"""The ``processor`` command line (typer). Every command takes ``--json``.

Exit codes: 0 success, 1 error, 2 usage, 3 not found or no answer in time,
4 verification found differences.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from pydantic import ValidationError

from processor.clients.client import Client, fact_dict, status_dict
from processor.config.settings import Settings
from processor.engine.host import Host
from processor.errors import ProcessorError
from processor.facts.codec import decode_fact
from processor.facts.payload import InvalidPayloadError, dumps, loads
from processor.transport.deployment import Deployment, ensure_topics

__all__ = ["main"]

logger = logging.getLogger("processor")

cli = typer.Typer(
    name="processor",
    help="Durable, event-sourced pipelines on Kafka (or the embedded log).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
topics_cli = typer.Typer(help="Topics as code: create what is missing, report drift.")
cli.add_typer(topics_cli, name="topics")

EXIT_ERROR, EXIT_NOT_FOUND, EXIT_DIFFERENT = 1, 3, 4

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON.")]
BrokerOption = Annotated[
    str | None, typer.Option("--broker", help="kafka://host:port[,...]; default: embedded log")
]
DataDirOption = Annotated[
    Path | None, typer.Option("--data-dir", help="Embedded log and state directory [.processor]")
]
AppOption = Annotated[str, typer.Option("--app", help="Pipelines to load, as module:attribute.")]


@dataclass
class _Options:
    broker: str | None
    data_dir: Path | None
    topic_prefix: str | None

    def settings(self) -> Settings:
        overrides: dict[str, Any] = {}
        if self.broker is not None:
            overrides["broker"] = self.broker
        if self.data_dir is not None:
            overrides["data_dir"] = self.data_dir
        if self.topic_prefix is not None:
            overrides["topic_prefix"] = self.topic_prefix
        try:
            return Settings(**overrides)
        except ValidationError as exc:
            _fail(f"invalid settings: {exc.errors()[0]['msg']}", json_output=False)

    def deployment(self) -> Deployment:
        return Deployment.from_settings(self.settings())


def _options(ctx: typer.Context, broker: str | None, data_dir: Path | None) -> _Options:
    """The root options, overridden by the same options given after the command."""
    root: _Options = ctx.obj
    return _Options(
        broker if broker is not None else root.broker,
        data_dir if data_dir is not None else root.data_dir,
        root.topic_prefix,
    )


@cli.callback()
def _root(
    ctx: typer.Context,
    broker: Annotated[
        str | None, typer.Option(help="kafka://host:port[,host:port]; default: embedded log")
    ] = None,
    data_dir: Annotated[
        Path | None, typer.Option(help="Embedded log and state directory [.processor]")
    ] = None,
    topic_prefix: Annotated[str | None, typer.Option(help="Prefix of every topic name")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log at INFO")] = False,
) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    ctx.obj = _Options(broker, data_dir, topic_prefix)


def _emit(value: dict[str, Any] | list[Any], json_output: bool, text: str) -> None:
    typer.echo(json.dumps(value, default=str) if json_output else text)


def _fail(message: str, json_output: bool, code: int = EXIT_ERROR) -> NoReturn:
    if json_output:
        typer.echo(json.dumps({"error": message}))
    else:
        typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _load_app(target: str, json_output: bool = False) -> Any:
    from processor.worker.pipeline import load_application

    try:
        return load_application(target)
    except ProcessorError as exc:
        _fail(str(exc), json_output)


def _stop_on_signals(stop: threading.Event) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())


@cli.command()
def run(
    ctx: typer.Context,
    app: AppOption,
    workers: Annotated[int, typer.Option(help="In-process worker threads")] = 2,
    broker: BrokerOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Run the processor (and in-process workers) until interrupted."""
    options = _options(ctx, broker, data_dir)
    pipelines = _load_app(app)
    host = Host(options.deployment(), pipelines, workers=workers)
    _stop_on_signals(host.stop_event)
    try:
        host.start()
    except ProcessorError as exc:
        _fail(str(exc), json_output=False)
    typer.echo(f"processor {host.instance_id} running ({workers} workers); Ctrl-C stops", err=True)
    host.wait()
    host.stop()
    if host.errors:
        _fail(f"stopped after an error: {host.errors[0]!r}", json_output=False)


@cli.command()
def worker(
    ctx: typer.Context,
    app: AppOption,
    threads: Annotated[int, typer.Option(help="Worker threads in this process")] = 1,
    broker: BrokerOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Run workers only: consume segments.work, run steps, produce results."""
    from processor.worker.service import Worker

    options = _options(ctx, broker, data_dir)
    pipelines = _load_app(app)
    deployment = options.deployment()
    stop = threading.Event()
    _stop_on_signals(stop)
    runners = [
        Worker(
            deployment.transport,
            pipelines,
            deployment.topology,
            group=deployment.settings.worker_group,
        )
        for _ in range(threads)
    ]
    pool = [threading.Thread(target=w.run, args=(stop,), daemon=True) for w in runners]
    for thread in pool:
        thread.start()
    while any(t.is_alive() for t in pool) and not stop.wait(0.5):
        pass
    stop.set()
    for thread in pool:
        thread.join(30)


@cli.command()
def submit(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="Pipeline name")],
    input_json: Annotated[str, typer.Option("--input", help="Run input as JSON")],
    idempotency_key: Annotated[str | None, typer.Option(help="Deduplicate retries")] = None,
    deadline_s: Annotated[
        float | None, typer.Option(help="Run deadline, seconds from now (overrides the pipeline's)")
    ] = None,
    wait: Annotated[float, typer.Option(help="Seconds to wait for the processor")] = 30.0,
    json_output: JsonFlag = False,
    broker: BrokerOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Submit a run; print its id and whether this call created it."""
    options = _options(ctx, broker, data_dir)
    try:
        value = loads(input_json.encode())
    except InvalidPayloadError as exc:
        _fail(f"--input: {exc}", json_output, code=2)
    deployment = options.deployment()
    ensure_topics(deployment)
    client = Client(deployment.transport, deployment.topology, deployment.settings.state_dir)
    try:
        deadline_ms = None if deadline_s is None else int(time.time() * 1000 + deadline_s * 1000)
        receipt = client.submit(
            pipeline, value, idempotency_key, wait_s=wait, deadline_ms=deadline_ms
        )
    finally:
        client.close()
    if receipt.refusal:
        _emit(receipt.as_dict(), json_output, f"refused: {receipt.refusal}: {receipt.detail}")
        raise typer.Exit(EXIT_ERROR)
    if receipt.created is None:
        _emit(
            receipt.as_dict(),
            json_output,
            f"{receipt.run_id} queued; no processor answered in {wait}s",
        )
        raise typer.Exit(EXIT_NOT_FOUND)
    _emit(
        receipt.as_dict(),
        json_output,
        f"{receipt.run_id} {'created' if receipt.created else 'existing'}",
    )


@cli.command()
def status(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="Run id")],
    json_output: JsonFlag = False,
    broker: BrokerOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Show a run's status, result and error (as of the end of runs.facts)."""
    options = _options(ctx, broker, data_dir)
    deployment = options.deployment()
    state = (
        Client(deployment.transport, deployment.topology, deployment.settings.state_dir)
        .current(run_id)
        .state
    )
    if state is None:
        _fail(f"no run {run_id}", json_output, code=EXIT_NOT_FOUND)
    shown = status_dict(state)
    lines = "\n".join(
        f"{k}: {json.dumps(v) if isinstance(v, dict | list) else v}" for k, v in shown.items()
    )
    _emit(shown, json_output, lines)


@cli.command()
def history(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="Run id")],
    json_output: JsonFlag = False,
    broker: BrokerOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Show a run's facts in order (up to the end of runs.facts)."""
    options = _options(ctx, broker, data_dir)
    deployment = options.deployment()
    view = Client(deployment.transport, deployment.topology, deployment.settings.state_dir).current(
        run_id
    )
    facts = [decode_fact(raw) for raw in view.history]
    if not facts:
        _fail(f"no run {run_id}", json_output, code=EXIT_NOT_FOUND)
    rows = [fact_dict(f) for f in facts]
    text = "\n".join(f"{r['seq']:>4} {r['type']:<24} {r['fact_key']}" for r in rows)
    _emit(rows, json_output, text)


@cli.command()
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
    json_output: JsonFlag = False,
    broker: BrokerOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Rebuild projections from runs.facts into a fresh store (with --verify: compare)."""
    from tqdm import tqdm

    from processor.restore.replay import replay as run_replay

    options = _options(ctx, broker, data_dir)
    deployment = options.deployment()
    bars: list[tqdm[Any]] = []

    def progress(total: int) -> Any:
        bar = tqdm(total=total, unit="fact", disable=json_output, file=sys.stderr)
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
    text = f"replayed {report.facts} facts of {report.runs} runs in {report.seconds:.2f}s"
    if verify:
        text += (
            "; verified" if report.verified else "; DIFFERENCES:\n" + "\n".join(report.differences)
        )
    _emit(report.as_dict(), json_output, text)
    if verify and not report.verified:
        raise typer.Exit(EXIT_DIFFERENT)


@cli.command()
def demo(
    ctx: typer.Context,
    runs: Annotated[int, typer.Option(help="Runs to submit")] = 1000,
    workers: Annotated[int, typer.Option(help="In-process workers")] = 2,
    json_output: JsonFlag = False,
    broker: BrokerOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Run the bundled order pipeline end to end, then replay and verify."""
    from processor.examples.demo import app as demo_app
    from processor.examples.demo import payments_simulator
    from processor.examples.demo_runner import run_demo

    options = _options(ctx, broker, data_dir)
    try:
        report = run_demo(
            options.settings(), demo_app, runs, workers, handlers={"payments": payments_simulator}
        )
    except (ProcessorError, TimeoutError) as exc:
        _fail(str(exc), json_output)
    shown = report.as_dict()
    text = "\n".join(f"{k:>16}: {v}" for k, v in shown.items())
    _emit(shown, json_output, text)
    if not report.replay_verified or report.succeeded + report.failed != report.submitted:
        raise typer.Exit(EXIT_DIFFERENT)


def _reply_or_exit(reply: Any, json_output: bool, wait: float) -> dict[str, Any]:
    if reply is None:
        _fail(
            f"no processor answered in {wait}s (the command is queued)", json_output, EXIT_NOT_FOUND
        )
    if reply.refusal:
        shown = {"run_id": reply.run_id, "refusal": reply.refusal, "detail": reply.detail}
        _emit(shown, json_output, f"refused: {reply.refusal}: {reply.detail}")
        raise typer.Exit(EXIT_ERROR)
    response = json.loads(reply.response) if reply.response else {}
    return {"run_id": reply.run_id, "accepted": reply.created, "detail": reply.detail, **response}


@cli.command()
def cancel(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="Run id")],
    reason: Annotated[str, typer.Option(help="Why, kept in the stop intent")] = "",
    wait: Annotated[float, typer.Option(help="Seconds to wait for the processor")] = 30.0,
    json_output: JsonFlag = False,
    broker: BrokerOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Cancel a run: stop intent, then the running attempt settles and steps are compensated."""
    options = _options(ctx, broker, data_dir)
    deployment = options.deployment()
    client = Client(deployment.transport, deployment.topology, deployment.settings.state_dir)
    try:
        shown = _reply_or_exit(client.cancel(run_id, reason, wait_s=wait), json_output, wait)
    finally:
        client.close()
    _emit(
        shown,
        json_output,
        f"{run_id}: " + ("cancelling" if shown["accepted"] else str(shown["detail"])),
    )


@cli.command()
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
    json_output: JsonFlag = False,
    broker: BrokerOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Resolve an Unknown attempt with exactly one of --succeed, --fail, --retry."""
    if sum(x is not None and x is not False for x in (succeed, fail, retry)) != 1:
        _fail("give exactly one of --succeed, --fail and --retry", json_output, code=2)
    output = None
    if succeed is not None:
        try:
            output = loads(succeed.encode())
        except InvalidPayloadError as exc:
            _fail(f"--succeed: {exc}", json_output, code=2)
    action = "succeed" if succeed is not None else "fail" if fail is not None else "retry"
    options = _options(ctx, broker, data_dir)
    deployment = options.deployment()
    client = Client(deployment.transport, deployment.topology, deployment.settings.state_dir)
    try:
        reply = client.resolve(
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
    finally:
        client.close()
    shown = _reply_or_exit(reply, json_output, wait)
    _emit(
        shown,
        json_output,
        f"{run_id}: {action} accepted" if shown["accepted"] else f"{run_id}: {shown['detail']}",
    )


@cli.command()
def complete(
    ctx: typer.Context,
    token: Annotated[str, typer.Argument(help="Resume token from the boundary request")],
    payload_json: Annotated[
        str | None, typer.Option("--payload", help="Completion payload as JSON")
    ] = None,
    fail: Annotated[str | None, typer.Option(help="Report a failure with this error")] = None,
    idempotency_key: Annotated[str | None, typer.Option(help="Sender's key")] = None,
    json_output: JsonFlag = False,
    broker: BrokerOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Complete (or --fail) an await interaction, as an external system does."""
    from processor.clients.external import CompletionClient
    from processor.facts import tokens

    if (payload_json is None) == (fail is None):
        _fail("give exactly one of --payload and --fail", json_output, code=2)
    claims = tokens.parse(token)
    if claims is None:
        _fail("not a resume token", json_output, code=2)
    options = _options(ctx, broker, data_dir)
    deployment = options.deployment()
    client = CompletionClient(deployment.transport, deployment.topology)
    try:
        if fail is not None:
            sent = client.send(token, "failure", b"", fail, idempotency_key)
        else:
            try:
                value = loads((payload_json or "").encode())
            except InvalidPayloadError as exc:
                _fail(f"--payload: {exc}", json_output, code=2)
            sent = client.send(token, "success", dumps(value), None, idempotency_key)
    finally:
        client.close()
    shown = {
        "run_id": claims.run_id,
        "interaction": claims.interaction,
        "outcome": sent.outcome,
        "idempotency_key": sent.idempotency_key,
    }
    _emit(shown, json_output, f"sent {sent.outcome} for {claims.interaction} of {claims.run_id}")


@cli.command()
def rejected(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option(help="Show at most this many, newest last")] = 100,
    reason: Annotated[str | None, typer.Option(help="Only this reason")] = None,
    json_output: JsonFlag = False,
    broker: BrokerOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """List refused input kept in admission.rejected: reason, source, time, run id."""
    from processor.clients.rejected import rejected_records

    options = _options(ctx, broker, data_dir)
    rows = [r for r in rejected_records(options.deployment()) if reason in (None, r["reason"])]
    rows = rows[-limit:] if limit > 0 else rows
    text = "\n".join(
        f"{r['time']}  {r['reason']:<22} {r['source']:<40} run={r['run_id'] or '-'}  {r['detail']}"
        for r in rows
    )
    _emit(rows, json_output, text or "no rejected input")


@topics_cli.command("apply")
def topics_apply(
    ctx: typer.Context,
    json_output: JsonFlag = False,
    broker: BrokerOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Create missing topics and report drift from topics/topics.toml."""
    options = _options(ctx, broker, data_dir)
    deployment = options.deployment()
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
    _emit(shown, json_output, text or "topics up to date")
    if drift:
        raise typer.Exit(EXIT_DIFFERENT)


def main() -> None:
    try:
        cli()
    except ProcessorError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_ERROR)


schemas_cli = typer.Typer(help="Record schemas in the Schema Registry (Confluent wire format).")
cli.add_typer(schemas_cli, name="schemas")


@schemas_cli.command("apply")
def schemas_apply(ctx: typer.Context, json_output: JsonFlag = False) -> None:
    """Register every topic's schemas with BACKWARD compatibility (needs a registry)."""
    from processor.clients.schemas import apply_schemas
    from processor.errors import SchemaRefusedError

    try:
        applied = apply_schemas(_options(ctx, None, None).settings())
    except SchemaRefusedError as exc:
        _fail(str(exc), json_output=json_output)
    shown = [
        {"subject": a.subject, "id": a.schema_id, "compatibility": a.compatibility} for a in applied
    ]
    text = "\n".join(f"{a.subject}: id {a.schema_id} ({a.compatibility})" for a in applied)
    _emit(shown, json_output, text)
