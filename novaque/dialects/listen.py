"""The socket-level PostgreSQL LISTEN client that wakes idle consumers."""

from __future__ import annotations

import contextlib
import select
import socket
import time
from typing import Any

import sqlalchemy as sa

from novaque.dialects.base import NOTIFY_CHANNEL

#: An idle listening connection is checked with a query this often (seconds),
#: so a connection that died silently is noticed and replaced.
LISTEN_HEALTH_CHECK_S = 15.0


class _PostgresListener:
    """``LISTEN novaque`` on a dedicated autocommit psycopg 3 connection.

    The connection is held outside the engine's pool (it lives as long as the
    client and must never be handed to a query): it is opened the way the
    engine opens its connections (its ``connect_args``, ``creator`` and
    connect events included) and then detached from the pool for good.
    Waiting is a ``select`` on the connection's socket and a private socket
    pair, so :meth:`interrupt` ends a wait at once; notifications are then
    read without blocking.
    """

    def __init__(self, engine: sa.Engine) -> None:
        import psycopg

        conn: Any
        if engine.dialect.driver == "psycopg":
            proxied = engine.raw_connection()
            proxied.detach()
            conn = proxied.dbapi_connection
        else:  # another driver for the engine: libpq keywords work for psycopg too
            cargs, cparams = engine.dialect.create_connect_args(engine.url)
            params: dict[str, Any] = {k: v for k, v in cparams.items() if isinstance(v, (str, int))}
            params.setdefault("connect_timeout", 10)
            conn = psycopg.connect(*cargs, **params)
        self._conn = conn
        self._wake_r, self._wake_w = socket.socketpair()
        try:
            self._conn.autocommit = True
            self._conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
            self._wake_r.setblocking(False)
            self._wake_w.setblocking(False)
        except BaseException:
            self.close()
            raise
        self._checked = time.monotonic()

    def wait(self, timeout: float) -> list[str]:
        sock = self._conn.fileno()
        ready, _, _ = select.select([sock, self._wake_r], [], [], max(timeout, 0.0))
        if self._wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                while self._wake_r.recv(4096):
                    pass
        if sock in ready:
            # Read what arrived. A tiny timeout rather than 0, in case a
            # psycopg version reads a falsy timeout as "wait forever"; and
            # stop_after, or psycopg waits out that timeout for more after the
            # first batch (a millisecond added to every wake-up).
            topics = [n.payload for n in self._conn.notifies(timeout=0.001, stop_after=1)]
            if topics:
                self._checked = time.monotonic()
                return topics
            # Readable without a notification: maybe the server is closing
            # the connection. A query tells (it raises if so).
            self._health_check()
        elif time.monotonic() - self._checked > LISTEN_HEALTH_CHECK_S:
            self._health_check()
        return []

    def _health_check(self) -> None:
        self._conn.execute("SELECT 1")
        self._checked = time.monotonic()

    def interrupt(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._conn.close()
        for sock in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                sock.close()
