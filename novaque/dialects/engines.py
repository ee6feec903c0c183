"""Engines and pools set up for novaque, and the dialect chosen for an engine."""

from __future__ import annotations

import importlib
import time
import weakref
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

from novaque.dialects.base import Dialect
from novaque.errors import InvalidOption, UnsupportedDatabase

#: Engines built by :func:`novaque.connect` are already set up for novaque.
_PREPARED: weakref.WeakSet[sa.Engine] = weakref.WeakSet()
#: MySQL engines built by :func:`novaque.connect`: READ COMMITTED on every connection.
_READ_COMMITTED: weakref.WeakSet[sa.Engine] = weakref.WeakSet()
#: Asyncio PostgreSQL engines built by :func:`novaque.aio.connect`: their pool in autocommit.
_AUTOCOMMIT: weakref.WeakKeyDictionary[sa.Engine, sa.Engine] = weakref.WeakKeyDictionary()


def sqlite_own_engine(
    engine: sa.Engine, *, pool_size: int = 8, busy_timeout_ms: int | None = None
) -> sa.Engine:
    """An engine on the same file, set up for novaque's transactions.

    novaque's writes must take SQLite's write lock up front (``BEGIN
    IMMEDIATE``), so that waiting happens where ``busy_timeout`` applies;
    a deferred transaction that reads and then writes fails at once under
    contention. Changing how transactions begin on the application's
    engine would change the application's own transactions, so novaque
    opens its own engine on the same file instead.

    ``busy_timeout_ms`` replaces SQLite's wait for another connection's lock
    (the dialect's ``busy_timeout_ms``); 0: report ``database is locked`` at
    once.
    """
    url = engine.url
    database = url.database or ""
    if (
        database in ("", ":memory:")
        or database.startswith("file::memory:")
        or ("mode=memory" in database or url.query.get("mode") == "memory")
    ):
        raise UnsupportedDatabase(
            "novaque needs a file-backed SQLite database: an in-memory database "
            "is private to one connection and cannot be shared by novaque's "
            "connections, consumers and processes (use e.g. sqlite:///novaque.db)"
        )
    own = _new_engine(
        url,
        asynchronous=engine.dialect.is_async,
        pool_size=pool_size,
        max_overflow=2 * pool_size,
        pool_timeout=60,
        pool_reset_on_return=None,  # replaced by _rollback_if_open
    )
    configure_sqlite(own, busy_timeout_ms)
    event.listen(own, "reset", _rollback_if_open)
    return own


def sync_sqlite_engine(engine: sa.Engine, **setup: Any) -> sa.Engine:
    """A sync engine for the SQLite file of ``engine`` (one of an asyncio driver),
    set up as :func:`sqlite_own_engine` sets up novaque's own (``setup``: its
    keywords)."""
    probe = sa.create_engine(engine.url.set(drivername="sqlite"))
    try:
        return sqlite_own_engine(probe, **setup)
    finally:
        probe.dispose()


def _new_engine(url: sa.URL, *, asynchronous: bool, **kwargs: Any) -> sa.Engine:
    """A new engine for ``url``; for an asyncio driver, the ``sync_engine`` of an
    ``AsyncEngine`` (the asyncio twin runs novaque's statements on it)."""
    if asynchronous:
        from sqlalchemy.ext.asyncio import create_async_engine

        return create_async_engine(url, **kwargs).sync_engine
    return sa.create_engine(url, **kwargs)


def configure_sqlite(engine: sa.Engine, busy_timeout_ms: int | None = None) -> None:
    """Pragmas on every connection, and BEGIN IMMEDIATE for every transaction
    (``busy_timeout_ms``: see :func:`sqlite_own_engine`)."""
    from novaque.dialects.sqlite import BEGINS_IMMEDIATE, SQLiteDialect

    busy = SQLiteDialect.busy_timeout_ms if busy_timeout_ms is None else busy_timeout_ms

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, record: Any) -> None:
        # Let novaque, not the sqlite3 module, decide when transactions begin.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {int(busy)}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = FULL")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: sa.Connection) -> None:
        # Straight to the driver: this runs before every transaction, and
        # SQLAlchemy's statement machinery would cost more than SQLite does.
        # SQLAlchemy does not wrap what a "begin" event raises: the lock's
        # error is wrapped here, so that it is retried like any other.
        dbapi = conn.dialect.loaded_dbapi
        try:
            conn.connection.dbapi_connection.execute("BEGIN IMMEDIATE")  # type: ignore[union-attr]
        except dbapi.Error as exc:
            raise sa.exc.DBAPIError.instance(
                "BEGIN IMMEDIATE", None, exc, dbapi.Error, dialect=conn.dialect
            ) from exc

    BEGINS_IMMEDIATE.add(engine)


#: The module and class of each database's dialect layer, imported when a
#: process first works with that database (and never for the others).
_DIALECTS: dict[str, tuple[str, str]] = {
    "postgresql": ("novaque.dialects.postgres", "PostgresDialect"),
    "mysql": ("novaque.dialects.mysql", "MySQLDialect"),
    "mariadb": ("novaque.dialects.mysql", "MySQLDialect"),
    "sqlite": ("novaque.dialects.sqlite", "SQLiteDialect"),
}


def _dialect_class(name: str) -> type[Dialect] | None:
    """The dialect class for SQLAlchemy's dialect ``name``, or None if unsupported."""
    found = _DIALECTS.get(name)
    if found is None:
        return None
    cls: type[Dialect] = getattr(importlib.import_module(found[0]), found[1])
    return cls


def for_engine(engine: sa.Engine) -> Dialect:
    """The dialect layer for ``engine``'s database."""
    cls = _dialect_class(engine.dialect.name)
    if cls is None:
        raise UnsupportedDatabase(
            f"novaque does not support the {engine.dialect.name!r} database; "
            "it runs on PostgreSQL, MySQL/MariaDB and SQLite"
        )
    return cls()


def own_engine(engine: sa.Engine) -> sa.Engine:
    """The engine novaque should run its own transactions on, for a client of ``engine``.

    ``engine`` itself, except on SQLite when it was not made by
    :func:`create_engine`: then a second engine on the same file
    (:func:`sqlite_own_engine`), which the caller disposes of.
    """
    if engine.dialect.name == "sqlite" and engine not in _PREPARED:
        return sqlite_own_engine(engine)
    return engine


def autocommit_engine(engine: sa.Engine) -> sa.Engine | None:
    """The pool kept in autocommit for one-statement work, where :func:`create_engine`
    made one beside ``engine`` (asyncio PostgreSQL), else None."""
    return _AUTOCOMMIT.get(engine)


def session_ready(engine: sa.Engine) -> bool:
    """Whether every connection of ``engine`` was set up once for novaque's transactions.

    True for MySQL/MariaDB engines made by :func:`create_engine` (READ
    COMMITTED on every connection): the dialect's ``begin_transaction`` is
    then not needed.
    """
    return engine in _READ_COMMITTED


def class_for(conn: sa.Connection) -> type[Dialect]:
    """The dialect class of a connection (for work done on the caller's connection)."""
    cls = _dialect_class(conn.dialect.name)
    if cls is None:
        raise UnsupportedDatabase(f"novaque does not support the {conn.dialect.name!r} database")
    return cls


#: A pooled connection unused for longer than this is pinged before it is handed out.
PING_IDLE_S = 1.0


def _ping_when_idle(engine: sa.Engine) -> None:
    """Check a pooled connection before use only when it has been idle a while.

    ``pool_pre_ping`` would add a round trip to every transaction, which on
    the hot path (one publish, one claim, one ack) costs about as much as the
    statement itself. A connection used within the last second is as good as
    known alive; one that sat idle (and so may have been dropped by a server
    restart, a proxy or a timeout) is pinged, and a dead one is replaced
    before the caller sees it (SQLAlchemy's pessimistic disconnect recipe).
    A failure on a busy connection still invalidates the pool, as usual.
    """

    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_conn: Any, record: Any, proxy: Any) -> None:
        last = record.info.get("novaque_checkin")
        if last is None or time.monotonic() - last < PING_IDLE_S:
            return
        try:
            alive = engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:
            raise sa.exc.DisconnectionError(f"pooled connection is gone: {exc}") from exc
        if not alive:
            raise sa.exc.DisconnectionError("pooled connection is gone")

    @event.listens_for(engine, "checkin")
    def _checkin(dbapi_conn: Any, record: Any) -> None:
        record.info["novaque_checkin"] = time.monotonic()


def _rollback_if_open(dbapi_conn: Any, record: Any, state: Any) -> None:
    """Pool reset on return for MySQL and SQLite: roll back only if a transaction is open.

    SQLAlchemy's default reset sends ROLLBACK whenever a connection returns to
    the pool, even right after a COMMIT: one more round trip per transaction
    with PyMySQL (psycopg skips it when idle), one more hop to aiosqlite's
    thread for the asyncio twin on SQLite. Whether a transaction is open is
    read on the driver's own connection (``record.driver_connection``): for
    the asyncio twin ``dbapi_conn`` is SQLAlchemy's adapter, which does not
    carry it (a ROLLBACK went out after every COMMIT on asyncmy).
    """
    if state.transaction_was_reset or state.terminate_only:
        return
    if _in_transaction(record.driver_connection):
        dbapi_conn.rollback()


def _in_transaction(driver_conn: Any) -> bool:
    """Whether ``driver_conn`` has a transaction open (True when it cannot tell)."""
    # sqlite3 and aiosqlite say so themselves, without a call to the database.
    flag = getattr(driver_conn, "in_transaction", None)
    if isinstance(flag, bool):
        return flag
    # MySQL's server reports it in the status flags of every reply.
    status = getattr(driver_conn, "server_status", None)
    return status is None or bool(status & _SERVER_STATUS_IN_TRANS)


#: Bit of the MySQL protocol's server status flags: a transaction is open.
_SERVER_STATUS_IN_TRANS = 0x0001


#: Per backend: the extra that installs novaque's driver, and the URL form using it.
_DRIVERS = {
    "postgresql": ("postgres", "postgresql+psycopg://"),
    "mysql": ("mysql", "mysql+pymysql://"),
    "mariadb": ("mysql", "mariadb+pymysql://"),
}
#: The same for the asyncio twin: one extra installs every async driver.
_ASYNC_DRIVERS = {
    "postgresql": ("aio", "postgresql+psycopg://"),
    "mysql": ("aio", "mysql+asyncmy://"),
    "mariadb": ("aio", "mariadb+asyncmy://"),
    "sqlite": ("aio", "sqlite+aiosqlite://"),
}


def normalise_url(url: str | sa.URL, *, asynchronous: bool = False) -> sa.URL:
    """``url`` as novaque connects to it.

    ``postgres://`` (the form Heroku and many platforms give) is read as
    ``postgresql://``, and a URL that names no driver gets novaque's, whatever
    SQLAlchemy's own default for the scheme: psycopg 3 for
    ``postgresql://``, PyMySQL for ``mysql://`` and ``mariadb://``; for the
    asyncio client (``asynchronous``) psycopg, asyncmy and aiosqlite. A URL
    that names a driver keeps it.
    """
    parsed = sa.make_url(url)
    backend, plus, driver = parsed.drivername.partition("+")
    if backend == "postgres":
        backend = "postgresql"
    form = (_ASYNC_DRIVERS if asynchronous else _DRIVERS).get(backend)
    if not plus and form is not None:
        return parsed.set(drivername=form[1].removesuffix("://"))
    name = f"{backend}{plus}{driver}"
    return parsed if name == parsed.drivername else parsed.set(drivername=name)


def missing_driver(
    url: sa.URL, exc: ModuleNotFoundError, *, asynchronous: bool = False
) -> ModuleNotFoundError:
    """The error for a URL whose driver is not installed: the extra and URL form to use."""
    backend = url.get_backend_name()
    drivers = _ASYNC_DRIVERS if asynchronous else _DRIVERS
    extra, form = drivers.get(backend, drivers["postgresql"])
    named = url.drivername
    if named == form.removesuffix("://"):
        text = f"{exc}: install novaque's driver with pip install 'novaque[{extra}]'"
    else:
        text = (
            f"{named}:// needs a driver that is not installed ({exc}); novaque's driver "
            f"is installed with pip install 'novaque[{extra}]' and used with {form} URLs"
        )
    error = ModuleNotFoundError(text)
    error.name = exc.name
    return error


def _postgres_connect_args(url: sa.URL, pgbouncer: bool) -> dict[str, Any]:
    """The driver's connection arguments for a PostgreSQL engine of
    :func:`create_engine` (libpq's drivers: psycopg, psycopg2)."""
    try:
        driver = url.get_dialect().driver
    except Exception:  # an unknown driver: create_engine says so
        return {}
    args: dict[str, Any] = {}
    if driver.startswith("psycopg") and "connect_timeout" not in url.query:
        args["connect_timeout"] = CONNECT_TIMEOUT_S
    if pgbouncer and driver in ("psycopg", "psycopg_async"):
        # Prepared statements live in a server session, which transaction
        # pooling hands to another client after each transaction.
        args["prepare_threshold"] = None
    return args


def pool_size_for(max_in_flight: int) -> int:
    """The pool ``connect`` builds: a connection for each of a consumer's
    ``max_in_flight`` workers, and four for the claim loop, maintenance, the
    listener and the application's publishes (five at least)."""
    return max(5, max_in_flight + 4)


#: How long a new PostgreSQL connection may take (seconds) where the URL says
#: nothing (libpq's ``connect_timeout``; per host of a multi-host URL): a
#: server that accepts the connection but never answers must not hang a call.
CONNECT_TIMEOUT_S = 10


def create_engine(
    url: str | sa.URL, pool_size: int, *, asynchronous: bool = False, pgbouncer: bool = False
) -> sa.Engine:
    """Build an engine for ``url`` with the settings novaque runs best with.

    ``asynchronous``: ``url`` names an asyncio driver; the result is then the
    ``sync_engine`` of an ``AsyncEngine`` (wrap it in ``AsyncEngine``). ``url``
    is read by :func:`normalise_url`.
    ``pgbouncer``: PostgreSQL behind PgBouncer in transaction pooling, where
    no session state lasts beyond a transaction: psycopg's server-side
    prepared statements are off (``prepare_threshold=None``).
    """
    parsed = normalise_url(url, asynchronous=asynchronous)
    backend = parsed.get_backend_name()
    if pgbouncer and backend != "postgresql":
        raise InvalidOption(
            f"pgbouncer=True is for PostgreSQL URLs (postgresql+psycopg://), not {backend!r}"
        )
    if backend == "sqlite":
        try:
            probe = _new_engine(parsed, asynchronous=asynchronous)
        except ModuleNotFoundError as exc:
            raise missing_driver(parsed, exc, asynchronous=asynchronous) from None
        try:
            engine = sqlite_own_engine(probe)
        finally:
            probe.dispose()
    elif backend in ("postgresql", "mysql", "mariadb"):
        kwargs: dict[str, Any] = {"pool_size": pool_size, "max_overflow": pool_size}
        if backend == "postgresql":
            kwargs["connect_args"] = _postgres_connect_args(parsed, pgbouncer)
        else:
            kwargs["pool_recycle"] = 3600  # below MySQL's default wait_timeout
            # READ COMMITTED set once per connection instead of a SET TRANSACTION
            # before each of novaque's transactions (see MySQLDialect).
            kwargs["isolation_level"] = "READ COMMITTED"
            kwargs["pool_reset_on_return"] = None  # replaced by _rollback_if_open
        try:
            engine = _new_engine(parsed, asynchronous=asynchronous, **kwargs)
        except ModuleNotFoundError as exc:
            raise missing_driver(parsed, exc, asynchronous=asynchronous) from None
        _ping_when_idle(engine)
        if backend != "postgresql":
            _READ_COMMITTED.add(engine)
            event.listen(engine, "reset", _rollback_if_open)
        elif asynchronous:
            # psycopg's async connections switch autocommit with an awaited
            # call (the sync ones set a flag): one-statement work gets a pool
            # that stays in autocommit instead of two switches each time.
            auto = _new_engine(parsed, asynchronous=True, isolation_level="AUTOCOMMIT", **kwargs)
            _ping_when_idle(auto)
            _AUTOCOMMIT[engine] = auto
    else:
        raise UnsupportedDatabase(
            f"novaque does not support {backend!r} URLs; use postgresql+psycopg://, "
            "mysql+pymysql:// or sqlite:///"
        )
    _PREPARED.add(engine)
    return engine
