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

_LISTEN = f"LISTEN {NOTIFY_CHANNEL}; SELECT pg_backend_pid()"
_BACKEND = "SELECT pg_backend_pid()"


class ListenNotDelivered(Exception):
    """``LISTEN`` cannot wake anyone through this connection: a pooler between
    the client and PostgreSQL hands its statements to server sessions in turn
    (PgBouncer in transaction pooling), so the session that listens is not the
    client's, and notifications never reach it."""

    def __str__(self) -> str:
        return (
            "LISTEN does not reach this client through the connection pooler in front "
            "of PostgreSQL (PgBouncer in transaction pooling): consumers and long polls "
            "poll every poll_interval instead; say so with novaque.connect(url, "
            "pgbouncer=True) or Options(listen=False)"
        )


class _PostgresListener:
    """``LISTEN novaque`` on a dedicated autocommit psycopg 3 connection.

    The connection is held outside the engine's pool (it lives as long as the
    client and must never be handed to a query): it is opened the way the
    engine opens its connections (its ``connect_args``, ``creator`` and
    connect events included) and then detached from the pool for good.
    Waiting is a ``select`` on the connection's socket and a private socket
    pair, so :meth:`interrupt` ends a wait at once; notifications are then
    read without blocking.

    A pooler between the client and the server may hand the connection's
    statements to server sessions in turn (PgBouncer in transaction pooling):
    the session that listens is then not the client's, and no notification
    reaches it. The server session's pid tells: ``LISTEN`` returns it, and a
    client connected straight to the server was told the same pid when it
    connected (a pooler tells its own). Behind a pooler, :meth:`_pinned`
    checks that the session stays the client's, and so does every health
    check; :class:`ListenNotDelivered` is raised when it does not.

    The four steps that touch the connection (:meth:`_listen`,
    :meth:`_ready`, :meth:`_read`, :meth:`_query`) are all that
    :class:`_AwaitedPostgresListener` changes for an asyncio connection.
    """

    def __init__(self, engine: sa.Engine) -> None:
        self._wake_r, self._wake_w = socket.socketpair()
        self._conn: Any = None
        #: The pid of the server session that listens, and whether a pooler
        #: stands between (the client was told another pid).
        self._session = 0
        self._pooled = False
        try:
            self._wake_r.setblocking(False)
            self._wake_w.setblocking(False)
            self._conn = self._listen(engine)
            self._session = self._query(_LISTEN)
            self._pooled = self._conn.info.backend_pid != self._session
            if self._pooled:
                self._pinned(engine)
        except BaseException:
            self.close()
            raise
        self._checked = time.monotonic()

    def _listen(self, engine: sa.Engine) -> Any:
        """Open the listening connection (autocommit)."""
        import psycopg

        conn = _detached(engine)
        if conn is None:  # another driver for the engine: libpq keywords work for psycopg too
            cargs, params = _libpq_params(engine)
            conn = psycopg.connect(*cargs, **params)
        try:
            conn.autocommit = True
        except BaseException:
            conn.close()
            raise
        return conn

    def _pinned(self, engine: sa.Engine) -> None:
        """Behind a pooler: raise :class:`ListenNotDelivered` unless the
        listening session stays this connection's. Another connection of the
        engine holds a transaction open meanwhile: under transaction pooling
        it is handed the listening session (the one just freed) or this
        connection's next statement runs in another session."""
        other = engine.raw_connection()
        try:
            cursor = other.cursor()
            try:
                cursor.execute(_BACKEND)  # a transaction begins (not autocommit)
                held = int(cursor.fetchall()[0][0])
            finally:
                cursor.close()
            mine = self._query(_BACKEND)
            other.rollback()
        finally:
            other.close()
        if held == self._session or mine != self._session:
            raise ListenNotDelivered

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

    def _query(self, sql: str) -> int:
        """Run ``sql``; the integer its last statement returns."""
        cursor = self._conn.execute(sql)
        while cursor.nextset():
            pass
        return int(cursor.fetchone()[0])

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
        session = self._query(_BACKEND)
        self._checked = time.monotonic()
        if self._pooled and session != self._session:
            raise ListenNotDelivered

    def interrupt(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def hurry(self) -> None:
        """Nothing to do: the server wakes this one."""

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

    def _query(self, sql: str) -> int:
        return _await(self._fetched(sql))  # type: ignore[no-any-return]

    async def _fetched(self, sql: str) -> int:
        cursor = await self._conn.execute(sql)
        while cursor.nextset():
            pass
        return int((await cursor.fetchone())[0])

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
