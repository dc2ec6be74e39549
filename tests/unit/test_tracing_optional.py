"""Without OpenTelemetry installed the package works: tracing is off and costs nothing.

A child interpreter blocks every ``opentelemetry`` import, as on an install
without the ``otel`` extra, then uses the tracing entry points the client, the
worker and the processor call.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.apps.support import REPO_ROOT

_WITHOUT_OTEL = textwrap.dedent(
    """
    import logging, sys

    class Blocked:
        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry" or name.startswith("opentelemetry."):
                raise ImportError("no opentelemetry here")
            return None

    sys.meta_path.insert(0, Blocked())
    logging.basicConfig(level=logging.WARNING, format="%(message)s")

    import processor.cli, processor.engine.loop, processor.worker.executor
    from processor.telemetry import tracing

    given = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    with tracing.submit_span(given, pipeline="p") as span:
        assert span.traceparent == given
        span.annotate(run_id="r")
    with tracing.step_span(given, "processor.step s", step=0) as span:
        span.fail("E", "boom")
    tracing.record_span("processor.await", given, 1, 2, {"run_id": "r"})
    assert not tracing.enabled()
    assert tracing.configure(True) is False
    assert not tracing.enabled()
    assert not any(m.startswith("opentelemetry") for m in sys.modules)
    print("ok")
    """
)


def test_tracing_is_a_no_op_without_opentelemetry() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_OTEL],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    assert "opentelemetry-sdk is not installed: no spans" in done.stderr
