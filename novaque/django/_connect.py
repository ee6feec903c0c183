"""Django's databases as novaque sees them: clients, and publishing on Django's connection."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar, cast

import sqlalchemy as sa
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections, transaction

import novaque
from novaque import _publishing
from novaque.dialects.sqlite import BEGINS_IMMEDIATE
from novaque.errors import InvalidOption

__all__ = ["client", "database_url", "publish", "publish_many", "settings_dict"]

T = TypeVar("T")

#: Django's database engines novaque supports, with the SQLAlchemy backend of each.
ENGINES = {
    "django.db.backends.postgresql": "postgresql",
    "django.db.backends.mysql": "mysql",
    "django.db.backends.sqlite3": "sqlite",
}
#: The keys of the ``NOVAQUE`` settings dict.
SETTINGS_KEYS = ("OPTIONS", "CONSUMERS", "SHUTDOWN_TIMEOUT")
#: Connection ``OPTIONS`` of a Django database passed on to novaque's own connections.
_PG_OPTIONS = (
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "sslcrl",
    "connect_timeout",
    "options",
    "application_name",
    "target_session_attrs",
    "service",
    "passfile",
)
_MYSQL_OPTIONS = ("charset", "unix_socket", "read_default_file", "read_default_group")


def novaque_settings() -> dict[str, Any]:
    """The ``NOVAQUE`` settings dict (``{}`` when unset), its keys checked."""
    value = getattr(settings, "NOVAQUE", None)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidOption(f"settings.NOVAQUE must be a dict, got {type(value).__name__}")
    unknown = sorted(set(value) - set(SETTINGS_KEYS))
    if unknown:
        raise InvalidOption(
            f"settings.NOVAQUE has unknown key(s) {', '.join(map(repr, unknown))}; "
            f"the keys are {', '.join(map(repr, SETTINGS_KEYS))}"
        )
    return dict(value)


def settings_dict(using: str) -> dict[str, Any]:
    """The settings of Django database ``using`` (as its connection has them:
    the test database while Django's test runner runs)."""
    if not isinstance(using, str):
        raise TypeError(f"using must be a Django database alias (str), got {type(using).__name__}")
    # The settings, not connections[using]: that would import the database's
    # backend, which fails for an engine whose driver is missing.
    configured = connections.settings
    if using not in configured:
        aliases = ", ".join(map(repr, configured)) or "none"
        raise InvalidOption(
            f"{using!r} is not a database of settings.DATABASES (the aliases are {aliases})"
        )
    return cast("dict[str, Any]", configured[using])


def database_url(using: str = DEFAULT_DB_ALIAS) -> sa.URL:
    """The SQLAlchemy URL of Django database ``using``, with the driver Django uses.

    ``ENGINE``, ``NAME``, ``USER``, ``PASSWORD``, ``HOST`` and ``PORT`` are
    mapped (a ``HOST`` starting with ``/`` is a socket directory, as in
    Django), and of ``OPTIONS`` the libpq connection parameters (``sslmode``,
    ``sslrootcert``, ``connect_timeout``, ``options``, ...) on PostgreSQL and
    ``charset`` (default ``utf8mb4``, as Django's), ``unix_socket`` and
    ``read_default_file`` on MySQL. Raises :class:`~novaque.InvalidOption`
    for a database engine novaque does not support.
    """
    return url_of(using, settings_dict(using))


def url_of(using: str, found: Mapping[str, Any]) -> sa.URL:
    """:func:`database_url` of the settings ``found`` of database ``using``."""
    engine = found.get("ENGINE", "")
    backend = ENGINES.get(engine)
    if backend is None:
        supported = ", ".join(ENGINES)
        raise InvalidOption(
            f"novaque.django does not support the database engine {engine!r} of "
            f"DATABASES[{using!r}]; the supported engines are {supported}"
        )
    options = found.get("OPTIONS") or {}
    name = found.get("NAME")
    if backend == "sqlite":
        return sa.URL.create("sqlite", database=str(name) if name else None)
    host = found.get("HOST") or None
    query: dict[str, str] = {}
    if host is not None and str(host).startswith("/"):
        query["host" if backend == "postgresql" else "unix_socket"] = str(host)
        host = None
    if backend == "postgresql":
        drivername = "postgresql+psycopg"
        _require_psycopg3()
        for key in _PG_OPTIONS:
            if options.get(key) is not None:
                query[key] = str(options[key])
    else:
        drivername = "mysql+" + _mysql_driver()
        query["charset"] = "utf8mb4"
        for key in _MYSQL_OPTIONS:
            if options.get(key) is not None:
                query[key] = str(options[key])
    port = found.get("PORT")
    return sa.URL.create(
        drivername,
        username=found.get("USER") or None,
        password=found.get("PASSWORD") or None,
        host=host,
        port=int(port) if port else None,
        database=str(name) if name else None,
        query=query,
    )


def _require_psycopg3() -> None:
    from django.db.backends.postgresql import psycopg_any

    if not psycopg_any.is_psycopg3:
        raise InvalidOption(
            "novaque.django needs psycopg 3 for PostgreSQL (Django uses psycopg2 here): "
            "install it with pip install 'novaque[postgres]'"
        )


def _mysql_driver() -> str:
    """The SQLAlchemy driver name of the module Django's MySQL backend imports as MySQLdb."""
    import MySQLdb  # mysqlclient, or PyMySQL's shim

    return "pymysql" if getattr(MySQLdb, "__name__", "") == "pymysql" else "mysqldb"


# -- one client per alias ------------------------------------------------------------


class _Entry:
    """A client of one Django database, and the engine that lends it Django's connection."""

    def __init__(self, url: sa.URL, made: novaque.Client, using: str) -> None:
        self.url = url
        self.client = made
        self.using = using
        self._borrowing: sa.Engine | None = None
        self._lock = threading.Lock()

    def borrowing(self) -> sa.Engine:
        """The engine whose connections are Django's connection of this thread."""
        with self._lock:
            if self._borrowing is None:
                # SQLAlchemy learns the server's version and features on an
                # engine's first connection (and rolls that connection back):
                # learn them on a plain connection of its own (on SQLite one
                # that only reads: novaque's own would set WAL, which waits
                # for a Django transaction holding the write lock).
                url = self.client.engine.url
                probe = sa.create_engine(url, poolclass=sa.NullPool)
                try:
                    with probe.connect():
                        pass
                finally:
                    probe.dispose()
                using = self.using
                pool = sa.pool.NullPool(cast("Any", lambda: _lend(using)), reset_on_return=None)
                # Not create_engine(): its pool would run the dialect's set-up
                # (notice handlers, isolation level) on every connection lent.
                self._borrowing = sa.Engine(pool, probe.dialect, _lent_url(self.client))
            return self._borrowing


def _lent_url(made: novaque.Client) -> sa.URL:
    """The URL of the engine lending Django's connection to ``made``.

    Usually the client's own: a publish on Django's connection is then one
    on the client's database, which checks the schema once on novaque's own
    connections and buffers the publish's counters until Django commits
    (:func:`_after_django_commit`). Counting in Django's transaction instead
    would lock the counters' row until that transaction ends, making
    concurrent requests that publish wait for each other.

    Not where novaque's own transactions take the write lock at ``BEGIN``
    (SQLite's ``BEGIN IMMEDIATE``): a schema check on one of them, inside a
    Django transaction that holds the lock, would wait for that very
    transaction. There the URL names the driver, so it differs: publish then
    checks the schema on Django's connection (a read) and writes the counters
    in Django's transaction (one writer at a time anyway).
    """
    url = made.engine.url
    if made.own_engine not in BEGINS_IMMEDIATE:
        return url
    lent = url.set(drivername=f"{url.get_backend_name()}+{made.engine.dialect.driver}")
    assert lent != url, "the client's URL names its driver"
    return lent


_entries: dict[str, _Entry] = {}
_entries_lock = threading.Lock()


def client(using: str = DEFAULT_DB_ALIAS) -> novaque.Client:
    """The :class:`novaque.Client` of Django database ``using`` (one per alias and process).

    Built on first use by :func:`novaque.connect` from the database's Django
    settings (:func:`database_url`) with the ``Options`` fields of
    ``settings.NOVAQUE["OPTIONS"]``; novaque's own work (consumers,
    maintenance, stats, a :meth:`~novaque.Client.publish` outside Django's
    transaction) runs on its own connections, not Django's. When the
    database's settings change (Django's test runner switching to the test
    database), the next call returns a client of the new database.
    """
    return _entry(using).client


def _entry(using: str) -> _Entry:
    url = database_url(using)
    with _entries_lock:
        found = _entries.get(using)
        if found is not None and found.url == url:
            return found
        options = novaque_settings().get("OPTIONS") or {}
        if not isinstance(options, Mapping):
            raise InvalidOption(
                f'settings.NOVAQUE["OPTIONS"] must be a dict of novaque.Options fields, '
                f"got {type(options).__name__}"
            )
        try:
            made = novaque.connect(url, **options)
        except TypeError as exc:
            raise InvalidOption(f'settings.NOVAQUE["OPTIONS"]: {exc}') from None
        entry = _entries[using] = _Entry(url, made, using)
    if found is not None:
        found.client.shutdown(timeout=10)  # a client of the database used before
    return entry


def forget(using: str, made: novaque.Client) -> None:
    """Drop ``made`` from the cache (it was shut down): the next call builds a new client."""
    with _entries_lock:
        found = _entries.get(using)
        if found is not None and found.client is made:
            del _entries[using]


# -- publishing on Django's connection -------------------------------------------------


def publish(
    topic: str, body: bytes | str, *, using: str = DEFAULT_DB_ALIAS, **publish_options: Any
) -> int:
    """Publish one message in Django's current transaction on database ``using``; its id.

    Inside ``transaction.atomic(using=...)`` the message and its deliveries
    are written on Django's connection, in that transaction: they commit
    with it, and a rollback (of the block, or of a savepoint around the
    call) leaves nothing. Outside any ``atomic()`` block the call opens
    one, so the message is written whole or not at all. ``publish_options``
    are those of :meth:`novaque.Client.publish`: ``delay``, ``ttl``,
    ``max_attempts``, ``headers``, ``dedup_key``, ``group``. A failing
    publish rolls back only what it wrote (a savepoint), so the caller's
    block may go on.
    """
    _no_connection(publish_options)
    return _in_django(
        using, lambda made, conn: made.publish(topic, body, connection=conn, **publish_options)
    )


def publish_many(
    topic: str,
    bodies: Iterable[bytes | str],
    *,
    using: str = DEFAULT_DB_ALIAS,
    **publish_options: Any,
) -> list[int]:
    """Publish many messages in Django's current transaction on ``using``; their ids.

    As :func:`publish`, with the bulk inserts of
    :meth:`novaque.Client.publish_many` (``dedup_keys`` and ``groups`` have
    one entry per body).
    """
    _no_connection(publish_options)
    return _in_django(
        using,
        lambda made, conn: made.publish_many(topic, bodies, connection=conn, **publish_options),
    )


def _no_connection(options: dict[str, Any]) -> None:
    for key in ("connection", "session"):
        if key in options:
            raise TypeError(
                f"novaque.django publishes on Django's connection and takes no {key}=; "
                f"for a SQLAlchemy {key} use novaque.django.client().publish(..., {key}=...)"
            )


def _in_django(using: str, call: Callable[[novaque.Client, sa.Connection], T]) -> T:
    entry = _entry(using)
    with transaction.atomic(using=using), _lent(entry) as conn:
        result = call(entry.client, conn)
        _after_django_commit(conn, using)
    return result


@contextmanager
def _lent(entry: _Entry) -> Iterator[sa.Connection]:
    with entry.borrowing().connect() as conn:
        yield conn


def _after_django_commit(conn: sa.Connection, using: str) -> None:
    """Hand what the client does after a commit of ``conn`` (count the
    publish, wake this process's consumers) to Django's ``on_commit``: Django,
    not SQLAlchemy, commits this connection. A rollback of Django's block or
    savepoint discards it with Django's own hooks."""
    callbacks = _publishing.take_after_commit(conn)
    if callbacks:
        transaction.on_commit(functools.partial(_run_all, callbacks), using=using, robust=True)


def _run_all(callbacks: list[Callable[[], None]]) -> None:
    for callback in callbacks:
        callback()


def _lend(using: str) -> _Lent:
    """Django's DBAPI connection of this thread for ``using``, wrapped for SQLAlchemy."""
    wrapper = connections[using]
    wrapper.ensure_connection()
    return _Lent(wrapper.connection)


class _Lent:
    """Django's DBAPI connection as novaque's SQLAlchemy connection sees it.

    Statements go through (``cursor()``, and every attribute is read from
    the real connection); ``rollback()`` and ``close()``, which SQLAlchemy
    calls when its connection is closed or returned, do nothing: Django ends
    the transaction and owns the connection. ``commit()`` is never called
    (novaque's publish on a caller's connection does not commit) and raises
    if it were; attributes cannot be set, so no autocommit or isolation
    level of Django's connection is changed.
    """

    __slots__ = ("_raw",)

    def __init__(self, raw: Any) -> None:
        object.__setattr__(self, "_raw", raw)

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        return self._raw.cursor(*args, **kwargs)

    def rollback(self) -> None:
        """Nothing: Django rolls its transaction back (or commits it)."""

    def close(self) -> None:
        """Nothing: the connection stays Django's."""

    def commit(self) -> None:
        raise RuntimeError("novaque.django never commits Django's connection: Django does")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"novaque.django does not change Django's connection ({name})")
