"""The server itself: ports, the page route, auth off loopback, and ``processor worker``."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import IO

import httpx
import pytest

from processor.config.settings import Settings
from processor.errors import ConfigurationError
from processor.transport.deployment import Deployment
from processor.web.app import create_app
from processor.web.context import Readiness, WebContext
from processor.web.server import HttpServer
from tests.apps.support import REPO_ROOT, cli, subprocess_env
from tests.web.support import APP, TOKEN


def _context(tmp_path: Path, *, bind_host: str = "127.0.0.1") -> WebContext:
    from pydantic import SecretStr

    return WebContext(
        bind_host=bind_host,
        token=SecretStr(TOKEN),
        readiness=lambda: Readiness(False, reason="no partitions assigned yet"),
        deployment=Deployment.from_settings(Settings(data_dir=tmp_path / "data")),
        static_dir=tmp_path / "static",
    )


def _served(context: WebContext, host: str = "127.0.0.1") -> HttpServer:
    server = HttpServer(create_app(context), host, 0)
    server.start()
    return server


def _line_starting(stream: IO[str], start: str) -> str:
    """The first line of ``stream`` that begins with ``start`` (others are log lines)."""
    for line in stream:  # the process's own output: ends when it exits
        if line.startswith(start):
            return line
    raise AssertionError(f"the process exited without printing a line starting {start!r}")


def test_port_zero_is_a_free_port_and_stop_frees_it(tmp_path: Path) -> None:
    server = _served(_context(tmp_path))
    port = int(server.address.rsplit(":", 1)[1])
    assert port > 0
    assert httpx.get(f"{server.address}/healthz").json() == {"status": "ok"}
    taken = HttpServer(create_app(_context(tmp_path)), "127.0.0.1", port)
    with pytest.raises(ConfigurationError, match=r"cannot serve HTTP on 127\.0\.0\.1"):
        taken.start()
    server.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.address}/healthz")
    again = HttpServer(create_app(_context(tmp_path)), "127.0.0.1", port)  # free again
    assert again.start() == server.address
    again.stop()


def test_not_ready_says_why(tmp_path: Path) -> None:
    server = _served(_context(tmp_path))
    try:
        answer = httpx.get(f"{server.address}/readyz")
        assert answer.status_code == 503
        assert answer.json() == {"ready": False, "reason": "no partitions assigned yet"}
    finally:
        server.stop()


def test_the_page_and_its_static_files(tmp_path: Path) -> None:
    context = _context(tmp_path)
    server = _served(context)
    try:
        missing = httpx.get(f"{server.address}/")
        assert missing.status_code == 404
        assert missing.json()["error"] == "no_page"
    finally:
        server.stop()
    context.static_dir.mkdir()
    (context.static_dir / "index.html").write_text("<html><body>inspector</body></html>")
    (context.static_dir / "app.js").write_text("console.log('hi');")
    server = _served(context)
    try:
        page = httpx.get(f"{server.address}/")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert "inspector" in page.text
        script = httpx.get(f"{server.address}/static/app.js")
        assert script.status_code == 200 and "console.log" in script.text
        assert httpx.get(f"{server.address}/static/nothing.js").status_code == 404
    finally:
        server.stop()


def test_off_loopback_every_api_route_needs_the_token(tmp_path: Path) -> None:
    server = _served(_context(tmp_path, bind_host="0.0.0.0"), host="0.0.0.0")
    url = server.address.replace("0.0.0.0", "127.0.0.1")
    try:
        for path in ("/api/runs", "/api/runs/r-1"):
            answer = httpx.get(f"{url}{path}")
            assert answer.status_code == 401, path
            assert answer.json()["error"] == "unauthorized"
            assert answer.headers["www-authenticate"] == "Bearer"
        wrong = httpx.get(f"{url}/api/runs", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and "wrong" in wrong.json()["detail"]
        allowed = httpx.get(f"{url}/api/runs", headers={"Authorization": f"Bearer {TOKEN}"})
        assert allowed.status_code == 200, allowed.text
        assert allowed.json() == {"runs": [], "next_cursor": None, "partitions": []}
        for open_path in ("/healthz", "/metrics", "/openapi.json"):
            assert httpx.get(f"{url}{open_path}").status_code == 200, open_path
    finally:
        server.stop()


def test_a_worker_serves_health_and_metrics_only(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    assert cli(data_dir, "topics", "apply").returncode == 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "processor", "--data-dir", str(data_dir), "worker", "--app", APP],
        cwd=REPO_ROOT,
        env=subprocess_env(data_dir),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = _line_starting(proc.stderr, "http: serving on ")
        assert line.startswith("http: serving on http://127.0.0.1:"), line
        url = line.split()[-1]
        assert httpx.get(f"{url}/healthz").json() == {"status": "ok"}
        assert httpx.get(f"{url}/readyz").json()["ready"] is True
        assert "processor_step_duration_seconds" in httpx.get(f"{url}/metrics").text
        assert httpx.get(f"{url}/api/runs").status_code == 404
    finally:
        proc.terminate()
        proc.communicate(timeout=60)  # closes the pipe
    assert proc.returncode == 0


def test_no_http_serves_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with socket.socket() as probe:  # a port that nobody serves
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "processor", "--data-dir", str(data_dir), "run"),
            *("--app", APP, "--workers", "0", "--no-http", "--http-port", str(port), "--json"),
        ],
        cwd=REPO_ROOT,
        env=subprocess_env(data_dir),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready = _line_starting(proc.stdout, "{")
        assert '"ready": true' in ready and '"http"' not in ready
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/healthz")
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert "http: serving" not in err


def test_run_prints_its_address_and_puts_it_in_the_ready_line(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "processor", "--data-dir", str(data_dir), "run"),
            *("--app", APP, "--workers", "0", "--http-port", "0", "--json"),
        ],
        cwd=REPO_ROOT,
        env=subprocess_env(data_dir),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        address = _line_starting(proc.stderr, "http: serving on ").split()[-1]
        ready = json.loads(_line_starting(proc.stdout, "{"))
        assert ready["http"] == address
        assert httpx.get(f"{address}/readyz").json()["partitions"] == ready["partitions"]
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    assert proc.returncode == 0
