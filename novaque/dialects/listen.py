"""The socket-level PostgreSQL LISTEN clients (threads, asyncio) that wake idle consumers."""

from __future__ import annotations

import asyncio
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

    The four steps that touch the connection (:meth:`_listen`,
    :meth:`_ready`, :meth:`_read`, :meth:`_query`) are all that
    :class:`_AwaitedPostgresListener` changes for an asyncio connection.
    """

    def __init__(self, engine: sa.Engine) -> None:
        self._wake_r, self._wake_w = socket.socketpair()
        self._conn: Any = None
        try:
            self._wake_r.setblocking(False)
            self._wake_w.setblocking(False)
            self._conn = self._listen(engine)
        except BaseException:
            self.close()
            raise
        self._checked = time.monotonic()

    def _listen(self, engine: sa.Engine) -> Any:
        """Open the listening connection (autocommit, LISTEN sent)."""
        import psycopg

        conn = _detached(engine)
        if conn is None:  # another driver for the engine: libpq keywords work for psycopg too
            cargs, params = _libpq_params(engine)
            conn = psycopg.connect(*cargs, **params)
        try:
            conn.autocommit = True
            conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
        except BaseException:
            conn.close()
            raise
        return conn

    def _ready(self, timeout: float) -> tuple[bool, bool]:
        """Wait until the connection or the wake-up socket is readable: (conn, woken)."""
        sock = self._conn.fileno()
        ready, _, _ = select.select([sock, self._wake_r], [], [], max(timeout, 0.0))
        return sock in ready, self._wake_r in ready

    def _read(self) -> list[str]:
        # A tiny timeout rather than 0, in case a psycopg version reads a falsy
        # timeout as "wait forever"; and stop_after, or psycopg waits out that
        # timeout for more after the first batch (a millisecond added to every
        # wake-up).
        return [n.payload for n in self._conn.notifies(timeout=0.001, stop_after=1)]

    def _query(self, sql: str) -> None:
        self._conn.execute(sql)

    def wait(self, timeout: float) -> list[str]:
        readable, woken = self._ready(timeout)
        if woken:
            with contextlib.suppress(BlockingIOError):
                while self._wake_r.recv(4096):
                    pass
        if readable:
            topics = self._read()
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
        self._query("SELECT 1")
        self._checked = time.monotonic()

    def interrupt(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._close()
        for sock in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                sock.close()

    def _close(self) -> None:
        self._conn.close()


class _AwaitedPostgresListener(_PostgresListener):
    """The listener on a psycopg ``AsyncConnection``, for the asyncio twin.

    Called from inside SQLAlchemy's greenlet bridge on the event loop: each
    step awaits, so an idle wait lets the loop run everything else. Readiness
    is watched with the loop's ``add_reader`` on the same two sockets.
    """

    def _listen(self, engine: sa.Engine) -> Any:
        import psycopg

        conn = _detached(engine)
        if conn is None:
            cargs, params = _libpq_params(engine)
            conn = _await(psycopg.AsyncConnection.connect(*cargs, **params))
        try:
            _await(conn.set_autocommit(True))
            _await(conn.execute(f"LISTEN {NOTIFY_CHANNEL}"))
        except BaseException:
            _await(conn.close())
            raise
        return conn

    def _ready(self, timeout: float) -> tuple[bool, bool]:
        return _await(self._readable(timeout))  # type: ignore[no-any-return]

    async def _readable(self, timeout: float) -> tuple[bool, bool]:
        ready = await readable(
            {"conn": self._conn.fileno(), "woken": self._wake_r.fileno()}, timeout
        )
        return "conn" in ready, "woken" in ready

    def _read(self) -> list[str]:
        return _await(self._notified())  # type: ignore[no-any-return]

    async def _notified(self) -> list[str]:
        return [n.payload async for n in self._conn.notifies(timeout=0.001, stop_after=1)]

    def _query(self, sql: str) -> None:
        _await(self._conn.execute(sql))

    def _close(self) -> None:
        _await(self._conn.close())


async def readable(sockets: dict[str, int], timeout: float) -> set[str]:
    """Wait on the running loop until one of ``sockets`` (name: file descriptor)
    is readable or ``timeout`` seconds passed; the names of those readable."""
    loop = asyncio.get_running_loop()
    ready: set[str] = set()
    done: asyncio.Future[None] = loop.create_future()

    def mark(name: str) -> None:
        ready.add(name)
        if not done.done():
            done.set_result(None)

    def time_out() -> None:
        if not done.done():
            done.set_result(None)

    for name, fd in sockets.items():
        loop.add_reader(fd, mark, name)
    # The future itself is awaited, with a timer beside it: asyncio.wait would
    # wake this task one turn of the loop later, through a future of its own.
    timer = loop.call_later(max(timeout, 0.0), time_out)
    try:
        await done
    finally:
        timer.cancel()
        for fd in sockets.values():
            loop.remove_reader(fd)
    return ready


def _detached(engine: sa.Engine) -> Any:
    """A psycopg connection opened as ``engine`` opens them (its ``connect_args``,
    ``creator`` and connect events), taken out of the pool for good; None when
    the engine's driver is not psycopg."""
    if engine.dialect.driver != "psycopg":
        return None
    proxied = engine.raw_connection()
    conn = proxied.driver_connection  # read before detach() forgets it
    proxied.detach()
    return conn


def _libpq_params(engine: sa.Engine) -> tuple[list[Any], dict[str, Any]]:
    """Connection arguments for psycopg from an engine of another driver."""
    cargs, cparams = engine.dialect.create_connect_args(engine.url)
    params: dict[str, Any] = {k: v for k, v in cparams.items() if isinstance(v, (str, int))}
    params.setdefault("connect_timeout", 10)
    return list(cargs), params


def _await(awaitable: Any) -> Any:
    from sqlalchemy.util import await_only

    return await_only(awaitable)
