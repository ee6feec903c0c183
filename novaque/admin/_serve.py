"""Serving the admin app: waitress when installed, else the standard library's wsgiref."""

from __future__ import annotations

import importlib
import logging
import socketserver
import threading
from collections.abc import Callable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

__all__ = ["BackgroundServer", "serve", "start_background"]

log = logging.getLogger("novaque.admin")

WSGIApp = Callable[..., Any]


class _QuietHandler(WSGIRequestHandler):
    """Logs request lines (never bodies) through logging at DEBUG, not to stderr."""

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("admin %s " + format, self.client_address[0], *args)


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class BackgroundServer:
    """A threaded wsgiref server running in a background thread."""

    def __init__(self, app: WSGIApp, host: str, port: int) -> None:
        self._server = make_server(
            host, port, app, server_class=_ThreadingServer, handler_class=_QuietHandler
        )
        self.host = host
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="novaque-admin", daemon=True
        )

    @property
    def base_url(self) -> str:
        """``http://host:port`` (IPv6 hosts bracketed)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> BackgroundServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


def start_background(app: WSGIApp, host: str = "127.0.0.1", port: int = 0) -> BackgroundServer:
    """Serve ``app`` from a background thread (port 0 picks a free port)."""
    return BackgroundServer(app, host, port).start()


def serve(
    app: WSGIApp,
    host: str = "127.0.0.1",
    port: int = 8080,
    *,
    on_ready: Callable[[str, str], None] | None = None,
) -> None:
    """Serve ``app`` until interrupted: with waitress if installed, else wsgiref.

    ``on_ready(base_url, server_name)`` is called once the socket listens.
    """
    try:
        waitress: Any = importlib.import_module("waitress")
    except ImportError:
        waitress = None
    # The socket is closed however serving ends, Ctrl-C during on_ready included.
    if waitress is not None:
        server = waitress.create_server(app, host=host, port=port)
        try:
            if on_ready is not None:
                on_ready(f"http://{host}:{server.effective_port}", "waitress")
            server.run()
        finally:
            server.close()
        return
    background = BackgroundServer(app, host, port)
    try:
        if on_ready is not None:
            on_ready(background.base_url, "wsgiref")
        background._server.serve_forever()
    finally:
        background._server.server_close()
