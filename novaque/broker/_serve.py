"""Serving the broker with uvicorn, from a thread of its own (``novaque serve``, tests).

The client's maintenance (lease reaper, TTL purge, stats) runs on the
server's event loop: started at the server's startup, shut down at its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from typing import Any

from novaque.aio import AsyncClient

__all__ = ["Managed", "Server"]

#: How long a server may take to start listening.
START_TIMEOUT_S = 60.0


class Managed:
    """An ASGI application whose lifespan starts and shuts ``client`` down."""

    def __init__(self, app: Any, client: AsyncClient) -> None:
        self.app = app
        self.client = client

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.client.start()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.client.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return


class Server:
    """uvicorn serving ``app`` on ``host``:``port`` (0: any free port) from a
    thread with its own event loop."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, **config: Any) -> None:
        import uvicorn

        config.setdefault("log_level", "warning")
        config.setdefault("access_log", False)
        config.setdefault("log_config", None)  # the application's logging, untouched
        # Requests still running this long after a stop are cancelled (a
        # receive cancelled so gives back what it leased).
        config.setdefault("timeout_graceful_shutdown", 10)
        self.host = host
        self._server = uvicorn.Server(
            uvicorn.Config(app, host=host, port=port, lifespan="on", **config)
        )
        self.app = app
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name="novaque-broker", daemon=True)
        self._error: BaseException | None = None
        self.port = port

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported by start()
            self._error = exc

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self._server.serve(sockets=[self._socket])

    @property
    def base_url(self) -> str:
        """``http://host:port`` (IPv6 hosts bracketed)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> Server:
        """Start serving; return once it listens (``OSError`` if it cannot)."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # proto named: asyncio sets TCP_NODELAY only on sockets whose proto
        # is TCP, and without it each answer on a kept-alive connection waits
        # for the caller's delayed ACK (40 ms) between its headers and body.
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
        except OSError:
            sock.close()
            raise
        self._socket = sock
        self.port = int(sock.getsockname()[1])
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                if isinstance(self._error, OSError):
                    raise self._error
                raise RuntimeError(
                    "the broker did not start"
                    + (f": {self._error}" if self._error else " (see the log above)")
                )
            time.sleep(0.01)
        return self

    def alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop accepting, answer the receives that wait, finish what runs,
        shut the client down."""
        broker = _broker_of(self.app)
        loop = self._loop
        if broker is not None and loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop has just ended
                loop.call_soon_threadsafe(broker.close)
        self._server.should_exit = True
        self._thread.join(timeout)


def _broker_of(app: Any) -> Any:
    """The broker behind ``app`` (a :class:`Managed` or the Starlette app), if any."""
    inner = getattr(app, "app", app)
    state = getattr(inner, "state", None)
    return getattr(state, "broker", None)
