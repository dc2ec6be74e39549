"""``HttpServer``: uvicorn serving an ASGI app from a daemon thread.

The server binds its socket itself (so port 0 gives a free port, known before the
first request), installs no signal handlers (uvicorn leaves them alone off the
main thread: the command's own handlers stop the process), and ``stop`` asks it
to finish the requests in flight and waits for the thread.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

import uvicorn

from processor.errors import ConfigurationError

__all__ = ["HttpServer"]

logger = logging.getLogger(__name__)

_START_TIMEOUT_S = 10.0


class HttpServer:
    """One ASGI app on ``host:port`` (0: any free port), served by a uvicorn thread."""

    def __init__(self, app: Any, host: str, port: int) -> None:
        self._app, self._host, self._port = app, host, port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.address = ""  # http://host:port once started

    def start(self) -> str:
        """Bind, start serving, and return the address (``http://host:port``)."""
        sock = self._bind()
        config = uvicorn.Config(
            self._app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=5,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="http", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() >= deadline:
                sock.close()
                raise ConfigurationError(f"the HTTP server did not start on {self._host}")
            time.sleep(0.01)  # uvicorn sets ``started`` from its own thread
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        self.address = f"http://{shown}:{port}"
        logger.info("http: serving on %s", self.address)
        return self.address

    def _bind(self) -> socket.socket:
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self._host, self._port))
        except OSError as exc:
            sock.close()
            raise ConfigurationError(
                f"cannot serve HTTP on {self._host}:{self._port}: {exc.strerror}; "
                "set PROCESSOR_HTTP_PORT (0: any free port) or --no-http"
            ) from exc
        sock.listen(128)
        sock.setblocking(False)
        return sock

    def stop(self, timeout_s: float = 10.0) -> None:
        """Finish the requests in flight and stop the server thread."""
        if self._server is None or self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(timeout_s)
        self._server = self._thread = None
